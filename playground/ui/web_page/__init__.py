"""A saved run as one self-contained web page (``playground html RUN.jsonl --out run.html``, File ▸ Export web
page): no network, no files beside it, readable on a phone.

It shows the run's settings, the output shaded by the chosen token's raw probability with the app's own colour
scale and legend (each shade computed here by the app's ``shade_for_prob``), each token's candidates with their raw
and processed probabilities on hover or tap, a speculative run's drafted tokens marked accepted or rejected with q
and p, the logit lens's layers × tokens heat map, a beam search's tree and sequences, a side-by-side run's panes,
and the KV cache's measured size step by step. The data is inline, compact JSON; the page's script only draws it.

The output, its hover and its speculative marks are drawn here; every other part is a section of its own
(``web_page/sections/``: one module per part, found on import).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.speculative import SpeculativeRound
from playground.state import shade_fraction
from playground.state.text import visible_token_text
from playground.ui.style import (
    PROCESSED_COLOR,
    RAW_COLOR,
    SHADE_STOPS,
    SHADE_TICKS,
)
from playground.ui.web_page.common import compact, shaded
from playground.ui.web_page.sections import SECTIONS


def page_data(events: list[Any]) -> dict[str, Any]:
    """What the page draws, from a run's events: compact lists, not the events themselves."""
    from playground.config import RunSettings
    from playground.state import settings_summary

    started = next(e for e in events if isinstance(e, RunStarted))
    finished = next((e for e in events if isinstance(e, RunFinished)), None)
    settings, _unknown = RunSettings.from_plain_dict(started.settings)
    steps = [e for e in events if isinstance(e, TokenStep)]
    tokens = []
    for s in steps:
        text, _prob, bg, fg = shaded(s.text, s.raw_prob)
        tokens.append({
            "t": text, "raw": compact(s.raw_prob), "p": compact(s.prob), "rank": s.raw_rank, "h": compact(s.entropy, 3),
            "bg": bg, "fg": fg, "forced": s.forced,
            "c": [[visible_token_text(c.text), compact(c.raw_prob), compact(c.processed_prob), c.cut_by or ""]
                  for c in s.candidates],
            "chosen": s.token_id, "ids": [c.token_id for c in s.candidates],
        })
    marks: dict[int, dict[str, Any]] = {}
    for r in (e for e in events if isinstance(e, SpeculativeRound)):
        for k, d in enumerate(r.drafted[:r.emitted]):
            if d.accepted:
                marks[r.first_step + k] = {"kind": "accepted", "q": compact(d.draft_prob), "pp": compact(d.target_prob)}
        position = r.first_step + r.accepted
        if r.target_kind != "none" and r.accepted < r.emitted + 1:
            rejected = r.drafted[r.accepted] if r.accepted < len(r.drafted) else None
            marks[position] = {"kind": r.target_kind, "pp": compact(r.target_prob),
                               "q": compact(rejected.draft_prob) if rejected is not None else None,
                               "rejected": visible_token_text(rejected.text) if rejected is not None else ""}
    for step, mark in marks.items():
        if 0 <= step < len(tokens):
            tokens[step]["spec"] = mark
    return {
        "title": f"{settings.strategy} on {started.model_name}",
        "settings": settings_summary(settings),
        "prompt": started.prompt_text,
        "tokens": tokens,
        "sections": {name: data for name, data in ((sec.name, sec.data(events)) for sec in SECTIONS)
                     if data is not None},
        "stop": finished.stop_reason if finished is not None else "the saved run ends before the run did",
        "legend": {"stops": list(SHADE_STOPS),
                   # As the app's legend labels them: 100%, 10%, 1%, ≤0.1% (the darkest: that or less).
                   "ticks": [["≤0.1%" if t == SHADE_TICKS[-1] else f"{t * 100:g}%", shade_fraction(t)]
                             for t in SHADE_TICKS]},
        "colors": {"raw": RAW_COLOR, "processed": PROCESSED_COLOR},
    }


STYLE = """
body{font-family:"DejaVu Sans","Noto Sans","Noto Sans CJK SC","Noto Sans CJK JP",system-ui,sans-serif;margin:0;
 padding:12px;color:#222;background:#fafafa;line-height:1.4}
h1{font-size:1.15em;margin:0 0 4px}.settings{color:#555;font-size:.9em;margin-bottom:10px}
.out{font-family:"DejaVu Sans Mono","Noto Sans Mono CJK SC",monospace;white-space:pre-wrap;word-break:break-word;
 background:#fff;border:1px solid #ccc;padding:8px;font-size:15px}
.prompt{color:#888}.tok{cursor:pointer;border-radius:2px}.tok.sel{outline:2px solid #FFD84D}
.tok.forced{font-style:italic}.tok.accepted{border-bottom:3px solid #2E7D32}
.tok.correction{border-bottom:3px solid #C62828}.tok.bonus{border-bottom:3px solid #1565C0}
.legend{display:flex;align-items:center;gap:8px;margin:8px 0;font-size:.85em;flex-wrap:wrap}
.ramp{position:relative;width:220px;height:14px;border:1px solid #999;margin:0 18px 16px}
.ramp span{position:absolute;top:16px;font-size:.8em;transform:translateX(-50%)}
#tip{position:fixed;display:none;background:#FFFFE8;border:1px solid #777;padding:6px 8px;font-size:13px;
 max-width:min(440px,94vw);box-shadow:0 2px 6px rgba(0,0,0,.25);z-index:9}
#tip table{border-collapse:collapse}#tip td{padding:0 6px}#tip td.n{text-align:right}
.raw{color:var(--raw)}.proc{color:var(--proc)}
section{margin-top:16px}h2{font-size:1em;margin:0 0 6px}.wide{overflow-x:auto}
@media (max-width:600px){body{padding:6px}.out{font-size:14px}}
"""

SCRIPT = """
const D=JSON.parse(document.getElementById('run-data').textContent);
// As the app's format_percent: 62.1%, 0.43%, <0.01%.
const pct=v=>{const p=100*v;return p===0?'0%':p<0.01?'<0.01%':p<1?p.toFixed(2)+'%':p.toFixed(1)+'%';};
const esc=s=>s.replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
document.documentElement.style.setProperty('--raw',D.colors.raw);
document.documentElement.style.setProperty('--proc',D.colors.processed);
const out=document.getElementById('out');const tip=document.getElementById('tip');let sel=null;
D.tokens.forEach((t,i)=>{const s=document.createElement('span');s.className='tok'+(t.forced?' forced':'')+
 (t.spec?' '+t.spec.kind:'');s.textContent=t.t;s.style.background=t.bg;s.style.color=t.fg;s.dataset.step=i;
 out.appendChild(s);});
function tipHtml(i){const t=D.tokens[i];let h='<b>Step '+i+'</b> · raw '+pct(t.raw)+' · after processors '+
 pct(t.p)+' · raw rank '+t.rank+' · entropy '+t.h+' bits';
 if(t.spec){h+='<br>speculative: '+t.spec.kind+(t.spec.q!=null?' · q '+pct(t.spec.q):'')+' · p '+pct(t.spec.pp)+
 (t.spec.rejected?' · rejected draft '+esc(t.spec.rejected):'');}
 h+='<table><tr><td><b>candidate</b></td><td class="n raw"><b>raw</b></td><td class="n proc"><b>processed</b>'+
 '</td><td></td></tr>';
 t.c.forEach((c,k)=>{h+='<tr><td>'+esc(c[0])+'</td><td class="n raw">'+pct(c[1])+'</td><td class="n proc">'+
 (c[3]?'cut by '+esc(c[3]):pct(c[2]))+'</td><td>'+(t.ids[k]===t.chosen?'◀ chosen':'')+'</td></tr>';});
 return h+'</table>';}
function show(el){if(sel)sel.classList.remove('sel');sel=el;el.classList.add('sel');
 tip.innerHTML=tipHtml(+el.dataset.step);tip.style.display='block';const r=el.getBoundingClientRect();
 const w=tip.offsetWidth,h=tip.offsetHeight;let x=Math.min(r.left,innerWidth-w-4),y=r.bottom+6;
 if(y+h>innerHeight)y=Math.max(4,r.top-h-6);tip.style.left=Math.max(4,x)+'px';tip.style.top=y+'px';}
out.addEventListener('mouseover',e=>{if(e.target.dataset.step)show(e.target);});
out.addEventListener('click',e=>{if(e.target.dataset.step)show(e.target);});
document.addEventListener('click',e=>{if(!out.contains(e.target)&&!tip.contains(e.target)){tip.style.display='none';}});
const ramp=document.getElementById('ramp');
ramp.style.background='linear-gradient(to right,'+D.legend.stops.join(',')+')';
D.legend.ticks.forEach(([label,f])=>{const s=document.createElement('span');s.textContent=label;
 s.style.left=(100*f)+'%';ramp.appendChild(s);});
"""


def render_page(events: list[Any]) -> str:
    data = page_data(events)
    # JSON inside a <script> element: "</" must not end it early.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(data["title"])
    drawn = [sec for sec in SECTIONS if sec.name in data["sections"]]
    sections = "\n".join(f'<section id="{sec.name}-section" hidden><h2>{sec.heading}</h2>{sec.body}</section>'
                          for sec in drawn)
    # Each section's script runs as its own function, on its own data; one that throws leaves the others drawn.
    scripts = "".join(f"try{{(function(S){{{sec.script}}})(D.sections[{json.dumps(sec.name)}]);"
                      f"document.getElementById({json.dumps(sec.name + '-section')}).hidden=false;}}"
                      f"catch(e){{console.error({json.dumps(sec.name)},e);}}\n" for sec in drawn)
    style = STYLE + "".join(sec.style for sec in drawn)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{title} · Decoding Playground</title><style>{style}</style></head>
<body><h1>{title}</h1><div class="settings" id="settings">{html.escape(data["settings"])} · ended: {
html.escape(str(data["stop"]))}</div>
<div class="legend"><span>Shade = the chosen token's raw model probability (darker = less likely). Hover or tap a
token for its candidates.</span><div class="ramp" id="ramp"></div></div>
<div class="out" id="out"><span class="prompt">{html.escape(data["prompt"])}</span></div>
{sections}
<div id="tip"></div>
<script type="application/json" id="run-data">{payload}</script>
<script>{SCRIPT}{scripts}</script></body></html>
"""


def write_page(events: list[Any], out: str | Path) -> Path:
    path = Path(out)
    if path.suffix.lower() not in (".html", ".htm"):
        from playground.errors import ScreenshotError

        raise ScreenshotError(f"a web page is an .html file, not {path.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(events), encoding="utf-8")
    return path
