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
    if getattr(d, "bits_per_weight", None) is not None:
        notes.append(f"{d.bits_per_weight:g} bits per weight over the quantized layers, as stored")
    sections = [Section("INT4 layers", ["layer", "out x in", "precision", "group size", "relative error", "why float"],
                        rows, notes)]
    choice = getattr(d, "choice", None)
    if choice:
        ladder = [[f"{r['share']:.1%}", f"{r['bits']:g}", f"{r['ppl_delta']:+.2%}", f"{r['top1']:.4f}",
                   "yes" if r["passed"] else "no", f"{r['seconds']:.1f}" if "seconds" in r else "",
                   "chosen" if r["share"] == choice["chosen"] else ""]
                  for r in choice["rungs"]]
        said = [f"the share of the INT4 layers' weights kept for 8 bits, the most error per weight first, judged on "
                f"{choice['tokens']} tokens of {choice['text']} against {choice['budget']}"
                + (f", under --max-bits-per-weight {choice['max_bits_per_weight']:g}"
                   if choice.get("max_bits_per_weight") is not None else "")]
        if choice.get("would_pass"):
            said.append(f"{choice['would_pass']['share']:.1%} ({choice['would_pass']['bits']:g} bits per weight) held "
                        "it, above the cap")
        sections.append(Section("INT4 choice of 8-bit layers", ["share in 8 bits", "bits per weight", "perplexity",
                                                                 "top-1", "held", "seconds", ""], ladder, said))
    return sections
