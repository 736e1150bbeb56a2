"""`python -m switchsd.serve_bench`: many requests under load; batched vanilla / SD / MineDraft's PSD (see
switchsd.serve.bench)."""
from .serve.bench import main

if __name__ == "__main__":
    main()
