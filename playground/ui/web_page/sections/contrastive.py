"""Contrastive decoding and DoLa: which amateur ran (for DoLa, which variant), the strip of steps (magenta where the
contrast overruled the expert's top token), each step's candidates with the expert's and the amateur's
log-probabilities and the contrast score (hover or tap a step), for DoLa the divergence of every candidate layer per
step with the premature layer it picked, and the run's figures, as the contrastive view gives them."""

from __future__ import annotations

import math
from typing import Any

from playground.events.contrastive import ContrastiveStarted, ContrastStep
from playground.state.text import visible_token_text
from playground.ui.web_page.charts import TABLE_STYLE
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

CHANGED_COLOR = "#EE3377"  # the contrast chose another token than the expert's top (the view's magenta)
KEPT_COLOR = "#BBBBBB"


def contrastive_data(events: list[Any]) -> dict[str, Any] | None:
    from playground.state.contrastive import DOLA_DIVERGENCE, ContrastiveState, dola_variant
    from playground.ui.views.contrastive.figures import figures_html

    started = next((e for e in events if isinstance(e, ContrastiveStarted)), None)
    steps = [e for e in events if isinstance(e, ContrastStep)]
    if started is None or not steps:
        return None
    variant = dola_variant(started)
    state = ContrastiveState()
    for e in events:
        state.apply(e)
    def number(v: float) -> float | None:
        return compact(v, 4) if math.isfinite(v) else None

    temperature = f" at T = {started.amateur_temperature:g}" if started.amateur_temperature != 1 else ""
    return {
        "header": f"amateur {started.amateur}"
                  + (f" · variant {variant} ({DOLA_DIVERGENCE[variant]})" if variant else "")
                  + f": {started.detail}{temperature} · α = {started.alpha:g} · "
                  + ("sampled from the normalised scores" if started.do_sample else "greedy on the scores"),
        "variant": variant,
        # per step: chosen text, expert's top text, changed, forced, plausible count, cut, premature layer,
        # candidates [text, log p expert, log p amateur, score (None: not plausible), prob, expert rank, chosen]
        "steps": [[visible_token_text(s.text), visible_token_text(s.expert_text), int(s.changed), int(s.forced),
                   s.plausible_count, compact(s.cut_logprob, 4), s.premature_layer,
                   [[visible_token_text(c.text), compact(c.expert_logprob, 4), compact(c.amateur_logprob, 4),
                     number(c.score), compact(c.prob, 4), c.expert_rank, int(c.token_id == s.token_id)]
                    for c in s.candidates]] for s in steps],
        "dola_layers": list(started.dola_layers) if variant else [],
        "jsd": [[compact(v, 4) for v in s.layer_jsd] for s in steps] if variant else [],
        "figures": figures_html(state), "colors": [CHANGED_COLOR, KEPT_COLOR],
    }


SCRIPT = """
document.getElementById('con-head').textContent=S.header;
document.getElementById('con-figures').innerHTML=S.figures;
const St=S.steps,strip=document.getElementById('con-strip'),cand=document.getElementById('con-cand');
let h='';St.forEach((s,k)=>{h+='<span class="cstep'+(s[2]?' changed':'')+'" data-k="'+k+'" style="background:'+
 (s[2]?S.colors[0]:S.colors[1])+'" title="step '+k+': chose '+esc(s[0])+(s[2]?' over the expert\\'s top '+esc(s[1]):
 ' (the expert\\'s top)')+(s[3]?' · forced':'')+' · plausible set '+s[4]+' tokens'+(s[6]>=0?' · premature layer '+
 s[6]:'')+'">'+esc(s[0])+'</span>';});strip.innerHTML=h;
const f=v=>v==null?'−∞':v.toFixed(3);
function show(k){const s=St[k];strip.querySelectorAll('.cstep').forEach(e=>e.classList.toggle('sel',+e.dataset.k===k));
 let t='<b>Step '+k+'</b>: chose '+esc(s[0])+' · the expert\\'s top '+esc(s[1])+' · cut: log p ≥ '+s[5]+
 (s[6]>=0?' · premature layer '+s[6]:'')+' · ★ chosen; grey: outside the plausible set (score −∞)'+
 '<table class="vtab"><tr><th>token</th><th>expert rank</th><th>log p expert'+
 '</th><th>log p amateur</th><th>score</th><th>p (contrast)</th><th></th></tr>';
 s[7].forEach(c=>{t+='<tr class="ccand'+(c[3]==null?' cut':'')+'"><td class="t">'+esc(c[0])+'</td><td>'+c[5]+
 '</td><td>'+c[1].toFixed(3)+'</td><td>'+c[2].toFixed(3)+'</td><td>'+f(c[3])+'</td><td>'+pct(c[4])+'</td><td>'+
 (c[6]?'★':'')+'</td></tr>';});cand.innerHTML=t+'</table>';}
strip.addEventListener('mouseover',e=>{if(e.target.dataset.k)show(+e.target.dataset.k);});
strip.addEventListener('click',e=>{if(e.target.dataset.k)show(+e.target.dataset.k);});
const first=St.findIndex(s=>s[2]);show(first>=0?first:St.length-1);
if(S.variant&&S.jsd.length){const Ly=S.dola_layers;let top=0;S.jsd.forEach(r=>r.forEach(v=>{if(v>top)top=v;}));
 let g='<table class="dola"><tr><th>layer</th>'+St.map((s,k)=>'<th>'+k+'</th>').join('')+'</tr>';
 Ly.forEach((l,i)=>{g+='<tr><th>'+l+'</th>'+S.jsd.map((r,k)=>{const v=r[i],pick=St[k][6]===l;return '<td class="'+
  (pick?'pick':'')+'" style="background:rgba(68,1,84,'+(0.1+0.8*v/(top||1)).toFixed(2)+')" title="step '+k+
  ' · layer '+l+' · divergence '+v+' nats'+(pick?' · the premature layer':'')+'">'+(pick?'●':'')+'</td>';}).join('')+
  '</tr>';});document.getElementById('con-dola').innerHTML=
 '<div class="note">DoLa: each candidate layer\\'s divergence from '+
 'the final layer at each step (darker = more); ● the premature layer it contrasted with</div>'+g+'</table>';}
"""

SECTION = Section(
    name="contrastive", order=55,
    heading="Contrastive decoding: the expert against the amateur, step by step",
    body='<div class="note" id="con-head"></div><div class="note" id="con-figures"></div><div class="note">'
         f'<span style="background:{CHANGED_COLOR}">&nbsp;&nbsp;</span> the contrast overruled the expert\'s top '
         'token · hover or tap a step for its candidates (score = log p expert − log p amateur)</div>'
         '<div class="out" id="con-strip"></div><div class="wide" id="con-cand"></div>'
         '<div class="wide" id="con-dola"></div>',
    script=SCRIPT, data=contrastive_data,
    style=TABLE_STYLE + ".cstep{cursor:pointer;margin-right:1px;border-radius:2px}.cstep.changed{color:#fff}"
                  ".cstep.sel{outline:2px solid #FFD84D}.ccand.cut{color:#999}"
                  ".dola{border-collapse:collapse;font-size:10px;margin-top:6px}.dola td{width:14px;height:12px;"
                  "text-align:center;color:#fff;padding:0}.dola th{font-weight:normal;color:#555;padding:0 3px}")
