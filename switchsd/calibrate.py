"""`python -m switchsd.calibrate`: measure this device's verification cost curve (see switchsd.target.calibrate)."""
from .target.calibrate import main

if __name__ == "__main__":
    main()
