"""The INT4 passes' own report section (``Int4Details.sections``, of ``quantize_int4`` and ``quantize_int4_graph``):
each Linear's group size and error, and why any stayed in float. Given the pass's ``Int4Details``."""

from __future__ import annotations

from infopt.core.section import Section
from infopt.core.section import format_number as num


def int4_sections(d) -> list[Section]:
    """The per-layer INT4 table of one record's ``Int4Details``."""
    rows = [[r["name"], "x".join(map(str, r["shape"])), "int4", str(r.get("group_size") or d.group_size),
             num(r["error"], ".3g"), ""] for r in d.layers]
    rows += [[name, "-", "float", "-", "-", why] for name, why in d.kept.items()]
    notes = [f"{d.method.upper()}, group size {d.group_size} asked, "
             f"{'symmetric' if d.symmetric else 'asymmetric'}; {len(d.layers)}/{len(rows)} Linear layers INT4"]
    return [Section("INT4 layers", ["layer", "out x in", "precision", "group size", "relative error", "why float"], rows, notes)]
