"""`python -m switchsd.tempsweep`: the temperature sweep (lossless sampling at T > 0) (see switchsd.eval.tempsweep)."""
from .eval.tempsweep import main

if __name__ == "__main__":
    main()
