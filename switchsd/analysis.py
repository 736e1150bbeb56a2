"""`python -m switchsd.analysis`: analyses: the copy regime, the drafting tax, temperature (see switchsd.eval.analysis)."""
from .eval.analysis import main

if __name__ == "__main__":
    main()
