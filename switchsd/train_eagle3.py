"""`python -m switchsd.train_eagle3`: EAGLE-3 self-distillation: data and training (see switchsd.training.eagle3)."""
from .training.eagle3 import main

if __name__ == "__main__":
    main()
