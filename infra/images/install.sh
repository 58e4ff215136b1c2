#!/bin/sh
# A role's environment in /opt/tether, in two layers so that a change to the project alone reinstalls only it:
#   install.sh deps EXTRAS    every dependency of the project with those extras ("a,b"; "" for the core alone),
#                             the versions of the lock (resolved from pyproject.toml, which changes rarely)
#   install.sh wheel          the project's wheel, without its dependencies; then uv and pip leave the environment
#   install.sh tools "A B"    those packages and their dependencies alone (no Tether), the versions of the lock;
#                             then uv and pip leave the environment
# CA_BUNDLE: see the Containerfile.
set -eu
python=/opt/tether/bin/python
case "$1" in
  deps)
    extras=""
    for extra in $(echo "${2:-}" | tr ',' ' '); do extras="$extras --extra $extra"; done
    # shellcheck disable=SC2086  # one argument per extra
    ${CA_BUNDLE:+env SSL_CERT_FILE=$CA_BUNDLE} uv pip compile --quiet --python-version 3.11 --no-header \
        --constraint /build/requirements.lock $extras -o /build/requirements.txt /build/pyproject.toml
    ${CA_BUNDLE:+env SSL_CERT_FILE=$CA_BUNDLE} uv pip install --quiet --compile-bytecode --python $python \
        --requirement /build/requirements.txt ;;
  wheel)
    uv pip install --quiet --compile-bytecode --no-deps --python $python /build/dist/tether-*.whl
    uv pip check --python $python
    uv pip uninstall --quiet --python $python uv pip ;;
  tools)
    # shellcheck disable=SC2086  # one argument per package
    ${CA_BUNDLE:+env SSL_CERT_FILE=$CA_BUNDLE} uv pip install --quiet --compile-bytecode --python $python \
        --constraint /build/requirements.lock $2
    uv pip check --python $python
    uv pip uninstall --quiet --python $python uv pip ;;
  *)
    echo "usage: install.sh deps EXTRAS | install.sh wheel | install.sh tools \"PACKAGE ...\"" >&2; exit 2 ;;
esac
