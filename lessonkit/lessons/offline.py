"""The executed notebooks' HTML pages, made to work offline.

nbconvert's HTML page loads require.js and MathJax from a CDN and leaves every formula as `$...$` text for
MathJax to typeset in the browser, so on a laptop without a network the formulas stay raw TeX.
`offline_page` removes every script loaded from the network (MathJax with its configuration, require.js, and
the loader that would import mermaid for diagrams, which the lessons do not use) and renders each
formula of the markdown cells here, once, to inline SVG with matplotlib's mathtext (a TeX subset: fractions,
powers, indices, Greek letters; no LaTeX installation needed). A formula mathtext cannot parse is kept as its
TeX source in a <code> element, so the page never shows a broken picture.
"""
from __future__ import annotations

import html
import io
import re

_REMOTE_SCRIPT = re.compile(r'<script\b[^>]*\bsrc="(?:https?:)?//[^"]*"[^>]*>\s*</script>', re.I)
_MATHJAX_CONFIG = re.compile(r'<script\b[^>]*type="text/x-mathjax-config"[^>]*>.*?</script>', re.I | re.S)
_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.I | re.S)
_IMPORTS_REMOTE = re.compile(r"""import\s*\(\s*["'](?:https?:)?//|from\s+["'](?:https?:)?//""")
_MARKDOWN_CELL = re.compile(r'(<div class="[^"]*\bjp-RenderedMarkdown\b[^"]*"[^>]*>)(.*?)(</div>)', re.S)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$\w])\$(?![\s$])([^$\n]+?)(?<![\s\\])\$(?![\w$])")


def formula_svg(tex: str, size: float = 13.0) -> str | None:
    """One TeX formula as an inline <svg> (matplotlib mathtext at `size` points), without its metadata and
    comments, or None if mathtext cannot parse it."""
    from matplotlib import mathtext
    from matplotlib.font_manager import FontProperties
    buf = io.StringIO()
    try:
        mathtext.math_to_image(f"${tex}$", buf, prop=FontProperties(size=size), format="svg", dpi=72)
    except (ValueError, RuntimeError):
        return None
    svg = buf.getvalue()
    return re.sub(r"<!--.*?-->|<metadata>.*?</metadata>", "", svg[svg.index("<svg"):], flags=re.S)


def _render(tex_html: str, display: bool) -> str:
    tex = html.unescape(tex_html).strip()
    svg = formula_svg(tex, 15.0 if display else 13.0)
    label = html.escape(tex, quote=True)
    if svg is None:
        return f'<code class="math-source">{html.escape(tex)}</code>'
    # a span in both cases: a display formula sits inside the markdown's <p>, where a <div> is not allowed
    style = "display:block;text-align:center;margin:0.4em 0" if display else "display:inline-block;vertical-align:middle"
    return f'<span class="math" role="math" aria-label="{label}" style="{style}">{svg}</span>'


def render_math(markdown_html: str) -> str:
    """$$...$$ and $...$ in a markdown cell's HTML, each replaced by its rendered formula."""
    out = _DISPLAY.sub(lambda m: _render(m.group(1), True), markdown_html)
    return _INLINE.sub(lambda m: _render(m.group(1), False), out)


def offline_page(page: str) -> str:
    """nbconvert's HTML page with no script from the network and its formulas rendered (see the module)."""
    page = _MATHJAX_CONFIG.sub("", _REMOTE_SCRIPT.sub("", page))
    page = _SCRIPT.sub(lambda m: "" if _IMPORTS_REMOTE.search(m.group(0)) else m.group(0), page)   # mermaid's loader
    return _MARKDOWN_CELL.sub(lambda m: m.group(1) + render_math(m.group(2)) + m.group(3), page)
