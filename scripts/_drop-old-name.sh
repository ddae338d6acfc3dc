# Sourced by scripts/test and scripts/run-local: this project's distribution was called
# `ocrd` before it became ocr-inbox-daemon (`ocrd` on PyPI is OCR-D's). An editable
# install under the old name, left in .venv, shares the `ocrd` package with the new one,
# and ocrd refuses to start beside it (ocrd/service/owner.py). Remove it; OCR-D's is left alone.
if .venv/bin/python -m pip show ocrd 2>/dev/null | grep -q "^Summary: OCR daemon: watched inbox"; then
  .venv/bin/python -m pip uninstall -q -y ocrd
fi
# ...and the metadata its editable build left in the checkout, which Python finds on
# sys.path when run from here
if [[ -f ocrd.egg-info/PKG-INFO ]] && grep -q "^Summary: OCR daemon: watched inbox" ocrd.egg-info/PKG-INFO; then
  rm -rf ocrd.egg-info
fi
