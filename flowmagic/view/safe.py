"""Model text made safe to show as rich output: Markdown rendered without raw HTML, then sanitized.

A model's words are data, never markup we trust. JupyterLab trusts every output of a
notebook it ran itself (an exported and re-run flow, a replayed `%%flow_node` cell), so its
own sanitizer cannot be relied on. Every place that shows model text as HTML or Markdown
(the panel's output view and Show output, the ChatView, replayed and exported node cells,
the final result, the Markdown cells of an exported notebook) calls `model_bundle`,
`markdown_html` or `markdown_cell` here, and plain model text in HTML goes through `text_html`:

- Markdown is rendered to HTML by markdown-it-py with raw HTML turned off, so `<script>`,
  `<img onerror=...>` or `<iframe>` written by the model shows as the text it is;
- the HTML then goes through nh3 (ammonia): no script or style, no event handlers, no
  `javascript:` or `data:` URLs, no iframes, forms or images (an image URL would call out
  to a server the model chose: a Markdown image shows as `[image: its alt text]`);
- fenced code stays code (`<pre><code>`), never run, never turned into markup.

The result is wrapped in a block that MathJax leaves alone, so "$5 and $10" stays text.
"""

from __future__ import annotations

import html
from functools import lru_cache

__all__ = ["markdown_html", "sanitize_html", "model_bundle", "preformatted", "text_html",
           "markdown_cell", "streamed_bundle", "NO_MATH"]

_DROPPED = {"img", "area", "map"}
_SCHEMES = {"http", "https", "mailto"}
NO_MATH = "tex2jax_ignore mathjax_ignore"   # classes of a block MathJax leaves alone
_WRAP = f'<div class="flowmagic-model-text {NO_MATH}">{{}}</div>'


@lru_cache(maxsize=None)
def _markdown():
    """The Markdown renderer, raw HTML off (imported on first use: %load_ext stays fast)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    md.add_render_rule("image", _image_as_text)
    return md


def _image_as_text(renderer, tokens, idx, options, env) -> str:
    """An image in model Markdown shows as its alt text, `[image: ...]`: loading it would call
    a server the model chose, and dropping it would hide that the model meant one."""
    alt = renderer.renderInlineAsText(tokens[idx].children or [], options, env)
    return f"<em>[image: {text_html(alt)}]</em>" if alt.strip() else "<em>[image]</em>"


@lru_cache(maxsize=None)
def _cleaner():
    """nh3's cleaner: its default safe lists (no script, style, iframe, form, object, no
    on* attribute), minus images; links only to http, https and mailto."""
    import nh3

    tags = set(nh3.ALLOWED_TAGS) - _DROPPED
    attributes = {tag: set(attrs) for tag, attrs in nh3.ALLOWED_ATTRIBUTES.items()
                  if tag not in _DROPPED}
    return nh3.Cleaner(tags=tags, attributes=attributes, url_schemes=_SCHEMES,
                       link_rel="noopener noreferrer nofollow")


def sanitize_html(html: str) -> str:
    """`html` with only harmless tags, attributes and link schemes left (nh3)."""
    return _cleaner().clean(html or "")


def markdown_html(text: str) -> str:
    """A model's Markdown as sanitized HTML (raw HTML in it shows as text)."""
    return _WRAP.format(sanitize_html(_markdown().render(text or "")))


def model_bundle(text: str, *, head: str = "") -> dict[str, str]:
    """A MIME bundle for model text: sanitized HTML and the plain text, never text/markdown.

    `head` is Markdown of our own (a title line) shown above the model's text.
    """
    text = text or ""
    return {"text/html": markdown_html(head + text), "text/plain": text}


def streamed_bundle(text: str, *, head: str = "") -> dict[str, str]:
    """Like `model_bundle`, for text still arriving: shown as it is, escaped, in a <pre>.
    Rendering and cleaning the whole Markdown again for every streamed piece would cost the
    kernel time quadratic in the length of the answer (~30 ms a piece at 16 kB)."""
    text = text or ""
    return {"text/html": markdown_html(head) + preformatted(text), "text/plain": text}


def preformatted(text: str) -> str:
    """Text that holds model text (a report with plan labels) as an escaped <pre> block:
    no fence it contains can end the block, and MathJax leaves it alone."""
    return _WRAP.format(f"<pre>{text_html(text or '')}</pre>")


def text_html(text: object) -> str:
    """Plain text (a node's requirement, an error, a name) as HTML text: shown as typed."""
    return html.escape(str(text))


def markdown_cell(text: str) -> str:
    """The source of a notebook Markdown cell showing `text` (Markdown with model text in it):
    the sanitized HTML of `markdown_html` as one raw HTML block. A blank line would end the
    block and hand the rest to the front end's Markdown parser a second time (text that came
    out of ours as `[x](javascript:...)` would become a link), so the block has no newline."""
    return markdown_html(text).replace("\n", "&#10;")
