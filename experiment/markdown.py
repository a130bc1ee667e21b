"""
The markdown of summary.md and samples.md: prose wrapped to a readable width, tables, table cells.
"""
import re

WIDTH = 100  # summary.md's prose lines (tables stay one row per line)



# a word that must not begin a line: it would turn the line into a list item, a quote, a heading or a table row
MD_LINE_START = re.compile(r"[-+*>#|]|\d+[.)]")



def wrap(text, width=WIDTH, bullet=False):
    """One markdown paragraph (bullet: a list item, its later lines indented) as lines of at most
    `width` characters; a longer word (a path) keeps a line of its own. Never breaks before a word
    that would change what the line is in markdown (a '+' of a sum, a '-')."""
    units = []
    for word in text.split():
        if units and MD_LINE_START.fullmatch(word):
            units[-1] += " " + word
        else:
            units.append(word)
    first, rest = ("- ", "  ") if bullet else ("", "")
    lines, line = [], None
    for u in units:
        if line is None:
            line = first + u
        elif len(line) + 1 + len(u) > width:
            lines.append(line)
            line = rest + u
        else:
            line += " " + u
    return "\n".join(lines + [line or first.rstrip()])



def md_table(rows, columns):
    def cell(v, f):
        return "-" if v is None else f.format(v)
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(k), f) for k, _, f in columns) + " |" for r in rows])


def md_cell(text):
    """Text as one markdown table cell: line breaks kept as <br>, pipes and markup escaped."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    return text.replace("\r", "").replace("\n", "<br>") or " "
