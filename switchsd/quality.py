"""`python -m switchsd.quality`: the verification lab's quality harness (see switchsd.eval.quality)."""
from .eval.quality import main

if __name__ == "__main__":
    main()
