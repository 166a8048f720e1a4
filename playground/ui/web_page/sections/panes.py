"""A side-by-side run: each pane's label, settings, output shaded by its own probabilities, and figures."""

from __future__ import annotations

from typing import Any

from playground.events.panes import PaneFinished, PaneStarted, PaneToken
from playground.ui.web_page.common import compact, shaded
from playground.ui.web_page.sections import Section


def panes_data(events: list[Any]) -> list[dict[str, Any]] | None:
    panes: dict[int, dict[str, Any]] = {}
    for e in events:
        if isinstance(e, PaneStarted):
            panes[e.pane] = {"label": e.label, "summary": e.summary, "tokens": [], "figures": {}}
        elif isinstance(e, PaneToken) and e.pane in panes:
            panes[e.pane]["tokens"].append(shaded(e.text, e.prob))
        elif isinstance(e, PaneFinished) and e.pane in panes:
            panes[e.pane]["figures"] = {k: compact(v, 4) for k, v in e.figures.items()}
            panes[e.pane]["stop"] = e.stop_reason
    return [panes[k] for k in sorted(panes)] or None


SCRIPT = """
const box=document.getElementById('panes');
S.forEach((p,k)=>{const d=document.createElement('div');d.className='pane';
 const h=document.createElement('h3');h.textContent=p.label;d.appendChild(h);
 const m=document.createElement('div');m.className='settings';m.textContent=p.summary+(p.stop?' · ended: '+p.stop:'');
 d.appendChild(m);const o=document.createElement('div');o.className='out';p.tokens.forEach((t,i)=>{
 const s=document.createElement('span');s.className='ptok';s.textContent=t[0];s.style.background=t[2];
 s.style.color=t[3]; s.title='pane '+(k+1)+' · step '+i+' · p '+pct(t[1]);o.appendChild(s);});d.appendChild(o);
 const f=Object.entries(p.figures);if(f.length){const g=document.createElement('div');g.className='settings';
 g.textContent=f.map(([a,b])=>a.replace(/_/g,' ')+' '+b).join(' · ');d.appendChild(g);}box.appendChild(d);});
"""

SECTION = Section(
    name="pane", order=30,
    heading="Side by side: each pane's output, shaded by its own probability of each token (hover for it)",
    body='<div id="panes" class="panes"></div>', script=SCRIPT, data=panes_data,
    style=".panes{display:flex;flex-wrap:wrap;gap:10px}.pane{flex:1 1 300px;min-width:0}"
          ".pane h3{font-size:.95em;margin:0}")
