"""`python -m switchsd.generate`: generate one text with any method (see switchsd.cli.generate)."""
from .cli.generate import main

if __name__ == "__main__":
    main()
