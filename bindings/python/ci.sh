#!/usr/bin/env bash
# CI of the Python package, from a clean clone: installs torch (CPU), the package (the README's
# one command) and pytest into the repository's .venv, runs the README's examples right after the
# install, then the Python tests (CPU tier; the GPU tier skips visibly without a device, or fails
# with KFUSE_REQUIRE_GPU=1), and checks the bindings crate with rustfmt and clippy.
set -euo pipefail
cd "$(dirname "$0")/../.."

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check "$@"; }

start=$(date +%s)
echo "python ci: disk before torch: $(df -h --output=avail . | tail -1 | tr -d ' ') free"
# torch from PyPI (the version on the GPU machine); the tests here use its CPU side. One pip call
# keeps every wheel it downloads on disk until it has installed them all (about 3 GB more than
# torch's 4 GB installed), so torch goes in first without its requirements, then each of those
# in its own call. triton is left out: it compiles GPU kernels, and the CPU tier never loads it.
pip install --quiet --no-deps torch==2.11.0
.venv/bin/python - <<'PY' > .venv/torch-requirements.txt
import importlib.metadata as metadata
for requirement in metadata.requires("torch"):
    name, _, marker = requirement.partition(";")
    if "extra ==" in marker or name.startswith("triton"):
        continue
    print(name.replace(" ", ""))  # the other markers are Linux's: this is a Linux machine
PY
while read -r requirement; do
    pip install --quiet "$requirement"
done < .venv/torch-requirements.txt
pip install --quiet maturin pytest
echo "python ci: disk after torch: $(df -h --output=avail . | tail -1 | tr -d ' ') free"
echo "python ci: torch and test tools installed in $(( $(date +%s) - start )) s"

start=$(date +%s)
pip install --quiet ./bindings/python
echo "python ci: pip install ./bindings/python in $(( $(date +%s) - start )) s"

# The tests run against the installed package, not the source folder. First, with only torch
# beside the package (as the README installs it; NumPy and safetensors are also blocked in those
# tests, for a .venv that has them from an earlier run): the READMEs' examples and the whole API.
pytest() { (cd bindings/python/tests && ../../../.venv/bin/python -m pytest -q -p no:cacheprovider "$@"); }
pytest test_install.py
# examples/ddp_giou.py (the multi-GPU test) uses NumPy; the backend tests compare with
# torchvision.ops' box losses and focal loss (the release paired with torch 2.11; it brings
# NumPy and Pillow).
# (--no-deps: torchvision's requirement on torch would otherwise bring triton back.)
pip install --quiet numpy pillow
pip install --quiet --no-deps torchvision==0.26.0
pytest --ignore=test_install.py .

(cd bindings/python && cargo fmt --check && cargo clippy --all-targets -- -D warnings)
echo "python ci: ok"
