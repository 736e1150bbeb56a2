"""python -m switchsd <subcommand>: see switchsd.cli.main."""
from .cli.main import main

main()
