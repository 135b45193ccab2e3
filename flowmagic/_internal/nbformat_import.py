"""nbformat, imported without compiling rfc3987-syntax's grammars.

nbformat validates with jsonschema, and jsonschema imports rfc3987-syntax when it is
installed (Jupyter's packages ask for jsonschema's format-nongpl extra). That module builds
some 38 Earley parsers when it is imported: 1.36 of the 1.49 s `import nbformat` took here,
paid by every `flowmagic run` before its kernel starts and again by the first export in a
kernel. Its only use is jsonschema's check of the "iri" and "iri-reference" formats, which no
notebook schema names. So jsonschema is first imported here with that module blocked: it
leaves those two checks out, as a jsonschema installed without the extra does. The block is
lifted at once (code of the user's can import the module), and a process that had imported
jsonschema already is left as it was."""

from __future__ import annotations

import sys


def _jsonschema_without_iri_grammars() -> None:
    if "jsonschema" in sys.modules or "rfc3987_syntax" in sys.modules:
        return
    sys.modules["rfc3987_syntax"] = None   # its import now fails, and jsonschema skips it
    try:
        import jsonschema  # noqa: F401
    except ImportError:   # no jsonschema: nbformat's own import says so
        pass
    finally:
        if "rfc3987_syntax" in sys.modules and sys.modules["rfc3987_syntax"] is None:
            del sys.modules["rfc3987_syntax"]


_jsonschema_without_iri_grammars()

import nbformat  # noqa: E402
import nbformat.v4 as v4  # noqa: E402

__all__ = ["nbformat", "v4"]
