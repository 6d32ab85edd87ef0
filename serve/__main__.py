"""`python -m serve`: the same command as `adafuse-serve`."""

from serve.app import main

main()
