"""`python -m switchsd.bench`: the benchmark: methods and peers side by side on a dataset (see switchsd.eval.bench)."""
from .eval.bench import main

if __name__ == "__main__":
    main()
