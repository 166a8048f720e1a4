"""A saved run as one self-contained web page (``playground html RUN.jsonl --out run.html``, File ▸ Export web
page): no network, no files beside it, readable on a phone.

It shows the run's settings, the output shaded by the chosen token's raw probability with the app's own colour
scale and legend (each shade computed here by the app's ``shade_for_prob``), each token's candidates with their raw
and processed probabilities on hover or tap, a speculative run's drafted tokens marked accepted or rejected with q
and p, the logit lens's layers × tokens heat map, a beam search's tree and sequences, a side-by-side run's panes,
and the KV cache's measured size step by step. The data is inline, compact JSON; the page's script only draws it.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from playground.events import LayerStep, PrefillDone, RunFinished, RunStarted, TokenStep, is_unit_step
from playground.events.beam import BeamStep
from playground.events.panes import PaneFinished, PaneStarted, PaneToken
from playground.events.speculative import SpeculativeRound
from playground.state import shade_fraction
from playground.state.text import flowing_token_text, visible_token_text
from playground.ui.style import (
    PROCESSED_COLOR,
    RAW_COLOR,
    SHADE_STOPS,
    SHADE_TICKS,
    shade_for_prob,
    text_color_on,
)

LENS_STOPS = ("#FFFFE5", "#FEC44F", "#EC7014", "#993404")  # the heat map: low entropy pale, high dark


def _round(value: float, digits: int = 5) -> float:
    return float(f"{value:.{digits}g}")


def beam_tree(events: list[Any]) -> dict[str, Any]:
    """A beam search's tree as nodes (step, row, text, log-prob, score, survived/finished) and edges (child node,
    parent node; -1: the prompt), each step's candidates in the order the run recorded them."""
    nodes: list[list[Any]] = []
    edges: list[list[int]] = []
    survivors: list[int] = []  # node of each running beam after the previous step (the prompt: none)
    for e in (e for e in events if isinstance(e, BeamStep)):
        mine: dict[tuple[int, int], int] = {}
        for row, c in enumerate(e.candidates):
            node = len(nodes)
            nodes.append([e.step, row, visible_token_text(c.text), _round(c.token_logprob, 4), _round(c.score, 4),
                          int(c.survived), int(c.finished),
                          None if c.finished_score is None else _round(c.finished_score, 4)])
            edges.append([node, survivors[c.beam] if c.beam < len(survivors) else -1])
            if c.survived:
                mine.setdefault((c.beam, c.token_id), node)
        survivors = [mine.get((parent, token), -1) for parent, token in zip(e.parents, e.token_ids, strict=True)]
    return {"nodes": nodes, "edges": edges}


def panes_of(events: list[Any]) -> list[dict[str, Any]]:
    """A side-by-side run's panes: each its label, settings, tokens (text, probability, shade) and figures."""
    panes: dict[int, dict[str, Any]] = {}
    for e in events:
        if isinstance(e, PaneStarted):
            panes[e.pane] = {"label": e.label, "summary": e.summary, "tokens": [], "figures": {}}
        elif isinstance(e, PaneToken) and e.pane in panes:
            shade = shade_for_prob(e.prob)
            panes[e.pane]["tokens"].append([flowing_token_text(e.text) if e.text else "·", _round(e.prob),
                                            shade.name(), text_color_on(shade).name()])
        elif isinstance(e, PaneFinished) and e.pane in panes:
            panes[e.pane]["figures"] = {k: _round(v, 4) for k, v in e.figures.items()}
            panes[e.pane]["stop"] = e.stop_reason
    return [panes[k] for k in sorted(panes)]


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
        shade = shade_for_prob(s.raw_prob)
        tokens.append({
            "t": flowing_token_text(s.text) if s.text else "·",
            "raw": _round(s.raw_prob), "p": _round(s.prob), "rank": s.raw_rank, "h": _round(s.entropy, 3),
            "bg": shade.name(), "fg": text_color_on(shade).name(), "forced": s.forced,
            "c": [[visible_token_text(c.text), _round(c.raw_prob), _round(c.processed_prob), c.cut_by or ""]
                  for c in s.candidates],
            "chosen": s.token_id, "ids": [c.token_id for c in s.candidates],
        })
    marks: dict[int, dict[str, Any]] = {}
    for r in (e for e in events if isinstance(e, SpeculativeRound)):
        for k, d in enumerate(r.drafted[:r.emitted]):
            if d.accepted:
                marks[r.first_step + k] = {"kind": "accepted", "q": _round(d.draft_prob), "pp": _round(d.target_prob)}
        position = r.first_step + r.accepted
        if r.target_kind != "none" and r.accepted < r.emitted + 1:
            rejected = r.drafted[r.accepted] if r.accepted < len(r.drafted) else None
            marks[position] = {"kind": r.target_kind, "pp": _round(r.target_prob),
                               "q": _round(rejected.draft_prob) if rejected is not None else None,
                               "rejected": visible_token_text(rejected.text) if rejected is not None else ""}
    for step, mark in marks.items():
        if 0 <= step < len(tokens):
            tokens[step]["spec"] = mark
    lens = [e for e in events if isinstance(e, LayerStep)]
    sequences = [{"text": q.text, "score": _round(q.score), "logp": _round(q.sum_logprobs)}
                 for q in (finished.sequences if finished is not None else ())]
    return {
        "title": f"{settings.strategy} on {started.model_name}",
        "settings": settings_summary(settings),
        "prompt": started.prompt_text,
        "tokens": tokens,
        "lens": [{"step": e.step, "h": [None if h is None else _round(h, 3) for h in e.layer_entropy],
                  "top": [visible_token_text(c[0].text) if c else "" for c in e.layer_top]} for e in lens],
        "sequences": sequences,
        "beam": beam_tree(events),
        "panes": panes_of(events),
        # The KV cache's measured size after the prompt and after each step (bytes).
        "kv": ([next((e.kv_cache_bytes for e in events if isinstance(e, PrefillDone)), 0)] +
               [e.kv_cache_bytes for e in events if is_unit_step(e)]),
        "stop": finished.stop_reason if finished is not None else "the saved run ends before the run did",
        "legend": {"stops": list(SHADE_STOPS),
                   # As the app's legend labels them: 100%, 10%, 1%, ≤0.1% (the darkest: that or less).
                   "ticks": [["≤0.1%" if t == SHADE_TICKS[-1] else f"{t * 100:g}%", shade_fraction(t)]
                             for t in SHADE_TICKS]},
        "colors": {"raw": RAW_COLOR, "processed": PROCESSED_COLOR, "lens": list(LENS_STOPS)},
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
section{margin-top:16px}h2{font-size:1em;margin:0 0 6px}
.lens{overflow-x:auto}.lens table{border-collapse:collapse;font-size:11px}.lens td{width:18px;height:14px}
.lens th{font-weight:normal;color:#555;padding-right:4px;text-align:right}
.seq td{padding:2px 8px;vertical-align:top}
.panes{display:flex;flex-wrap:wrap;gap:10px}.pane{flex:1 1 300px;min-width:0}.pane h3{font-size:.95em;margin:0}
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
if(D.lens.length){const L=D.lens,n=L[0].h.length;let max=0;L.forEach(c=>c.h.forEach(v=>{if(v!=null&&v>max)max=v;}));
 const mix=(a,b,f)=>{const p=x=>[1,3,5].map(k=>parseInt(x.substr(k,2),16));const A=p(a),B=p(b);
 return 'rgb('+A.map((v,k)=>Math.round(v+(B[k]-v)*f)).join(',')+')';};
 const col=v=>{const S=D.colors.lens,f=Math.min(1,v/(max||1))*(S.length-1),k=Math.min(S.length-2,Math.floor(f));
 return mix(S[k],S[k+1],f-k);};
 let h='<table>';for(let l=n-1;l>=0;l--){h+='<tr><th>L'+(l+1)+'</th>';L.forEach(c=>{const v=c.h[l];
 h+=v==null?'<td></td>':'<td style="background:'+col(v)+'" title="step '+c.step+' · layer '+(l+1)+' · '+v+
 ' bits · top '+esc(c.top[l])+'"></td>';});h+='</tr>';}
 document.getElementById('lens').innerHTML=h+'</table>';document.getElementById('lens-section').hidden=false;}
if(D.beam.nodes.length){const N=D.beam.nodes,dx=90,dy=22,pad=40;
 const steps=Math.max(...N.map(n=>n[0]))+1,rows=Math.max(...N.map(n=>n[1]))+1;
 const X=n=>pad+dx*(n[0]+1),Y=n=>12+dy*n[1],P=[pad,12+dy*(rows-1)/2];
 let g='<svg xmlns="http://www.w3.org/2000/svg" width="'+(pad+dx*(steps+1)+60)+'" height="'+(24+dy*rows)+'">';
 D.beam.edges.forEach(([c,p])=>{const n=N[c],a=p<0?P:[X(N[p]),Y(N[p])];g+='<line x1="'+a[0]+'" y1="'+a[1]+
 '" x2="'+X(n)+'" y2="'+Y(n)+'" stroke="'+(n[5]?'#444':'#bbb')+'" stroke-width="'+(n[5]?2:1)+'"/>';});
 g+='<rect x="'+(P[0]-6)+'" y="'+(P[1]-6)+'" width="12" height="12" fill="#222"><title>the prompt</title></rect>';
 N.forEach(n=>{g+='<g class="node'+(n[5]?' survived':'')+(n[6]?' finished':'')+'"><title>step '+n[0]+' · '+esc(n[2])+
 ' · token log-prob '+n[3]+' · beam score '+n[4]+(n[7]!=null?' · finished, score '+n[7]:'')+'</title>'+
 (n[6]?'<rect x="'+(X(n)-5)+'" y="'+(Y(n)-5)+'" width="10" height="10" fill="#00897B" transform="rotate(45 '+X(n)+
 ' '+Y(n)+')"/>':'<circle cx="'+X(n)+'" cy="'+Y(n)+'" r="'+(n[5]?6:3)+'" fill="'+(n[5]?'#8C96C6':'#bbb')+
 '" stroke="#333" stroke-width="'+(n[5]?1:0)+'"/>')+'<text x="'+(X(n)+8)+'" y="'+(Y(n)+4)+'" font-size="11" fill="'+
 (n[5]?'#222':'#999')+'">'+esc(n[2])+'</text></g>';});
 document.getElementById('tree').innerHTML=g+'</svg>';document.getElementById('beam-section').hidden=false;}
if(D.kv.length>1){const K=D.kv,w=Math.max(300,Math.min(900,8*K.length)),h=90,m=Math.max(...K)||1;
 const mb=v=>(v/1048576).toFixed(2)+' MB';let g='<svg xmlns="http://www.w3.org/2000/svg" width="'+(w+70)+
 '" height="'+(h+20)+'"><text x="0" y="12" font-size="11">'+mb(m)+'</text><text x="0" y="'+h+
 '" font-size="11">0</text>';const x=k=>60+k*w/Math.max(1,K.length-1),y=v=>h-(h-10)*v/m;
 g+='<polyline fill="none" stroke="#0077BB" stroke-width="2" points="'+K.map((v,k)=>x(k)+','+y(v)).join(' ')+'"/>';
 K.forEach((v,k)=>{g+='<circle class="kv" cx="'+x(k)+'" cy="'+y(v)+'" r="3" fill="#0077BB"><title>'+
 (k===0?'after the prompt':'after step '+(k-1))+': '+mb(v)+'</title></circle>';});
 document.getElementById('kv').innerHTML=g+'</svg>';document.getElementById('kv-section').hidden=false;}
if(D.panes.length){const box=document.getElementById('panes');
 D.panes.forEach((p,k)=>{const d=document.createElement('div');d.className='pane';
 const h=document.createElement('h3');h.textContent=p.label;d.appendChild(h);
 const m=document.createElement('div');m.className='settings';m.textContent=p.summary+(p.stop?' · ended: '+p.stop:'');
 d.appendChild(m);const o=document.createElement('div');o.className='out';p.tokens.forEach((t,i)=>{
 const s=document.createElement('span');s.className='ptok';s.textContent=t[0];s.style.background=t[2];
 s.style.color=t[3]; s.title='pane '+(k+1)+' · step '+i+' · p '+pct(t[1]);o.appendChild(s);});d.appendChild(o);
 const f=Object.entries(p.figures);if(f.length){const g=document.createElement('div');g.className='settings';
 g.textContent=f.map(([a,b])=>a.replace(/_/g,' ')+' '+b).join(' · ');d.appendChild(g);}box.appendChild(d);});
 document.getElementById('pane-section').hidden=false;}
if(D.sequences.length){let h='<table class="seq"><tr><th>#</th><th>score</th><th>log p</th><th>text</th></tr>';
 D.sequences.forEach((q,k)=>{h+='<tr><td>'+(k+1)+'</td><td>'+q.score+'</td><td>'+q.logp+'</td><td>'+esc(q.text)+
 '</td></tr>';});document.getElementById('beams').innerHTML=h+'</table>';
 document.getElementById('beam-section').hidden=false;}
"""


def render_page(events: list[Any]) -> str:
    data = page_data(events)
    # JSON inside a <script> element: "</" must not end it early.
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(data["title"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{title} · Decoding Playground</title><style>{STYLE}</style></head>
<body><h1>{title}</h1><div class="settings" id="settings">{html.escape(data["settings"])} · ended: {
html.escape(str(data["stop"]))}</div>
<div class="legend"><span>Shade = the chosen token's raw model probability (darker = less likely). Hover or tap a
token for its candidates.</span><div class="ramp" id="ramp"></div></div>
<div class="out" id="out"><span class="prompt">{html.escape(data["prompt"])}</span></div>
<section id="lens-section" hidden><h2>Logit lens: entropy of each layer's prediction (bits; darker = less
sure)</h2><div class="lens" id="lens"></div></section>
<section id="beam-section" hidden><h2>Beam search: the tree (bold: the beams that survived each step; ◆ a
finished hypothesis; hover a node for its numbers) and the returned sequences, best first</h2>
<div class="lens" id="tree"></div><div id="beams"></div></section>
<section id="pane-section" hidden><h2>Side by side: each pane's output, shaded by its own probability of each
token (hover for it)</h2><div id="panes" class="panes"></div></section>
<section id="kv-section" hidden><h2>KV cache: its measured size after the prompt and after each step</h2>
<div class="lens" id="kv"></div></section>
<div id="tip"></div>
<script type="application/json" id="run-data">{payload}</script>
<script>{SCRIPT}</script></body></html>
"""


def write_page(events: list[Any], out: str | Path) -> Path:
    path = Path(out)
    if path.suffix.lower() not in (".html", ".htm"):
        from playground.errors import ScreenshotError

        raise ScreenshotError(f"a web page is an .html file, not {path.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(events), encoding="utf-8")
    return path
