"""Sphinx extension: the ``{chapter}`` role, a link to another chapter that reads "chapter 6".

The number comes from the table of contents (``numbered`` parts in ``_toc.yml``), so prose never types a chapter
number that a reordering would make wrong. Forms, in MyST:

* ``{chapter}`06_chunked_prefill``` -> "chapter 6", linked to the page;
* ``{chapter}`06_chunked_prefill#chunking-hyperbola``` -> "chapter 6", linked to the label
  ``(chunking-hyperbola)=`` on that page (a missing label or one on another page is a warning, an error under -W);
* ``{chapter}`Chapter {n}'s hyperbola <06_chunked_prefill#chunking-hyperbola>``` -> explicit text, ``{n}`` the
  number.

Targets are document names relative to the page, as ``{doc}`` takes them. A target that is not a numbered chapter
is a warning.
"""
from __future__ import annotations

import re

from docutils import nodes
from sphinx.util import docname_join, logging

logger = logging.getLogger(__name__)
_EXPLICIT = re.compile(r"^(.*?)\s*<([^<>]+)>$", re.S)


class chapter_ref(nodes.Inline, nodes.TextElement):
    """Placeholder until the numbers are known (``doctree-resolved``)."""


def chapter_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    env = inliner.document.settings.env
    m = _EXPLICIT.match(text)
    title, target = (m.group(1), m.group(2)) if m else ("chapter {n}", text)
    docname, _, anchor = target.strip().partition("#")
    node = chapter_ref(rawtext, "", reftarget=docname_join(env.docname, docname), anchor=anchor,
                       template=title)
    node.source, node.line = inliner.document.current_source, lineno
    return [node], []


def _resolve(app, doctree, fromdocname) -> None:
    env = app.env
    std = env.get_domain("std")
    # A label on a section has a title (``labels``); one before a chart, a table or a paragraph has none
    # (``anonlabels``) and is linked the same way: the reader lands on the chart itself, not on its section.
    labels = {**std.anonlabels, **{k: v[:2] for k, v in std.labels.items()}}
    for node in list(doctree.findall(chapter_ref)):
        target, anchor, template = node["reftarget"], node["anchor"], node["template"]
        number = env.toc_secnumbers.get(target, {}).get("")
        if target not in env.found_docs or not number:
            logger.warning(f"chapter_refs: {target!r} is not a numbered chapter of the book", location=node)
            node.replace_self(nodes.Text(template.replace("{n}", "?")))
            continue
        uri = app.builder.get_relative_uri(fromdocname, target)
        if anchor:
            found = labels.get(anchor.lower())
            if not found or found[0] != target:
                logger.warning(f"chapter_refs: no label {anchor!r} on {target}", location=node)
            else:
                uri += "#" + found[1]
        text = template.replace("{n}", ".".join(map(str, number)))
        ref = nodes.reference("", "", internal=True, refuri=uri, classes=["chapter-ref"])
        ref += nodes.Text(text)
        node.replace_self(ref)


def setup(app):
    app.add_node(chapter_ref)
    app.add_role("chapter", chapter_role)
    app.connect("doctree-resolved", _resolve)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
