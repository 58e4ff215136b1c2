#!/bin/sh
# The project's wheel into /opt/tether with the extras named ("" for the core alone), every version from the lock;
# then uv and pip leave the environment (an image installs nothing later). CA_BUNDLE: see the Containerfile.
set -eu
extras=${1:+[$1]}
wheel=$(ls /build/tether-*.whl)
${CA_BUNDLE:+env SSL_CERT_FILE=$CA_BUNDLE} uv pip install --quiet --compile-bytecode \
    --python /opt/tether/bin/python --constraint /build/requirements.lock "$wheel$extras"
uv pip uninstall --quiet --python /opt/tether/bin/python uv pip
