"""`python -m services.buffer --config F`."""

from services.common.entry import main

if __name__ == "__main__":
    main("buffer")
