"""`python -m services.synchronizer --config F`."""

from services.common.entry import main

if __name__ == "__main__":
    main("synchronizer")
