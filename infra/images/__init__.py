"""Tether's container images: one per role (`roles.py`, the table the build, the tests and the manifests read),
built from `Containerfile` by `make images` (`build.py`), from a Debian base made with mmdebstrap where no
registry of images is reachable."""
