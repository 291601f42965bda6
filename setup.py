"""Build hook for the optional native extensions; all metadata lives in pyproject.toml.

``pip install -e '.[dev]'`` (``make install``) compiles them in place. Every extension
is ``optional``: without a C compiler the install still succeeds and etstore falls
back to its Python reference: the decoder in ``etstore/formats/et.py``, the standard
library's expat parser for MSCCL-IR XML, and the event loop ``_run`` in
``etstore/sim/_loop.py``. Under CI (``CI=true``) tests/test_extensions.py and the
parity tests fail when an extension is missing, so a broken build cannot pass unseen.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "etstore.formats._etcodec",
            sources=["etstore/formats/_etcodec.c"],
            optional=True,
        ),
        Extension(
            "etstore.formats._xmlscan",
            sources=["etstore/formats/_xmlscan.c"],
            optional=True,
        ),
        Extension(
            "etstore.sim._simloop",
            sources=["etstore/sim/_simloop.c", "etstore/sim/_simdefer.c", "etstore/sim/_simdefer_spec.c"],
            depends=["etstore/sim/_simstate.h"],
            optional=True,
        ),
    ]
)
