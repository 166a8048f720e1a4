"""Recorded attention (``--record-attention``): for a chosen generated token, the layers × positions heat map of its
attention (the mean over heads; brighter = more weight; a slider picks the token), and the run's summary as the
attention view gives it: the sink's share, attention against distance as bars, the heavy hitters, the evicted
positions and a smaller cache's quality against the full one.

Each step's map is kept sparse: per layer its ``TOP_POSITIONS`` heaviest positions (the others are drawn as no
weight, without a title); runs longer than ``MAX_STEPS`` keep their last ``MAX_STEPS`` steps' maps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from playground.events.attention import AttentionRow, AttentionStarted
from playground.state.text import visible_token_text
from playground.ui.web_page.charts import BARS, TABLE_STYLE
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

TOP_POSITIONS = 12  # 48 tokens of a 30-layer model: about 170 KB of page
MAX_STEPS = 100
# The app's heat map's colour map (pyqtgraph's "magma"), a few of its stops: dark = no weight, bright = the most.
MAGMA = ("#000004", "#3B0F70", "#8C2981", "#DE4968", "#FE9F6D", "#FCFDBF")


def _bucket_label(low: int, high: int) -> str:
    return str(low) if high == low + 1 else (f"{low}+" if high >= 1 << 30 else f"{low}–{high - 1}")


def attention_data(events: list[Any]) -> dict[str, Any] | None:
    from playground.state.attention import DISTANCE_EDGES, SINK_POSITIONS, AttentionState

    started = next((e for e in events if isinstance(e, AttentionStarted)), None)
    if started is None or not any(isinstance(e, AttentionRow) for e in events):
        return None
    fold = AttentionState()
    for e in events:
        fold.apply(e)
    maps = []
    for step in range(max(0, fold.steps - MAX_STEPS), fold.steps):
        row = fold.rows[step]
        matrix = fold.matrix(step, None)  # [layers, positions]: the mean over heads
        layers = []
        for weights in matrix:
            order = np.argsort(-weights, kind="stable")[:TOP_POSITIONS]
            # flat: position, weight, position, weight, ... (a third smaller than pairs)
            layers.append([x for p in sorted(order) if weights[p] > 0 for x in (int(p), compact(float(weights[p]), 3))])
        maps.append({"step": step, "q": row.query_position, "layers": layers,
                     "rest": [compact(float(v), 3) for v in fold.rest(step, None)]})
    profile = fold.distance_profile()
    used = int(np.nonzero(profile)[0].max()) + 1 if profile.any() else 0
    quality = fold.quality
    return {
        "layers": started.layers, "heads": started.heads, "top": started.top, "keep": TOP_POSITIONS,
        "texts": [visible_token_text(t) for t in fold.texts], "maps": maps,
        "sink": [SINK_POSITIONS, compact(fold.sink_share(), 4)], "steps": fold.steps,
        "distance": [[_bucket_label(DISTANCE_EDGES[i], DISTANCE_EDGES[i + 1]), compact(100 * float(profile[i]), 4)]
                     for i in range(used)],
        "heavy": [[p, compact(w, 3)] for p, w in fold.heavy_hitters(6)],
        "evicted": sorted(fold.evicted),
        "quality": None if quality is None else [compact(quality.mean_kl, 4), quality.agreement,
                                                 quality.first_divergence],
        "stops": list(MAGMA),
    }


SCRIPT = BARS + """
const T=S.texts,M=S.maps,box=document.getElementById('att-map'),pick=document.getElementById('att-step');
const mix=(a,b,f)=>{const p=x=>[1,3,5].map(k=>parseInt(x.substr(k,2),16));const A=p(a),B=p(b);
 return 'rgb('+A.map((v,k)=>Math.round(v+(B[k]-v)*f)).join(',')+')';};
const col=v=>{const C=S.stops,f=Math.min(1,v)*(C.length-1),k=Math.min(C.length-2,Math.floor(f));
 return mix(C[k],C[k+1],f-k);};
const word=p=>p<T.length?esc(T[p]):'';
function draw(i){const m=M[i],n=m.q+1;let top=0;
 m.layers.forEach(l=>{for(let j=1;j<l.length;j+=2)if(l[j]>top)top=l[j];});
 document.getElementById('att-head').textContent='token '+m.step+' (its query at position '+m.q+'), mean over '+
 S.heads+' heads; '+m.layers.length+' layers; recorded: '+(S.top?'the top '+S.top+' positions per layer and head':
 'every position')+'; the page keeps each layer\\'s '+S.keep+' heaviest · brightest = '+top;
 let h='<table class="attmap">';for(let l=m.layers.length-1;l>=0;l--){const row=new Array(n).fill(null);
  for(let j=0;j<m.layers[l].length;j+=2)row[m.layers[l][j]]=m.layers[l][j+1];h+='<tr><th title="layer '+(l+1)+
  ' · weight not recorded: '+m.rest[l]+'">L'+(l+1)+'</th>';
  row.forEach((w,p)=>{h+=w==null?'<td></td>':'<td style="background:'+col(w/(top||1))+'" title="token '+m.step+
  ' · layer '+(l+1)+' · position '+p+' '+word(p)+' · weight '+w+'"></td>';});h+='</tr>';}
 h+='<tr><th></th>';for(let p=0;p<n;p++)h+='<th class="pos">'+(p%5===0?p:'')+'</th>';
 box.innerHTML=h+'</tr></table>';
 let t='';for(let p=0;p<=Math.min(m.q+1,T.length-1);p++){t+='<span'+(p===m.q+1?' class="att-sel"':'')+
  (S.evicted.includes(p)?' class="att-gone"':'')+' title="position '+p+'">'+word(p)+'</span>';}
 document.getElementById('att-text').innerHTML=t;}
pick.max=M.length-1;pick.value=M.length-1;pick.addEventListener('input',()=>draw(+pick.value));draw(M.length-1);
let s='<b>Sink</b>: the first '+S.sink[0]+' positions receive '+pct(S.sink[1])+' of all attention (mean over '+
 S.steps+' steps, every layer and head).<br><b>Heavy hitters</b> (attention summed over the run, mean over layers '+
 'and heads): '+(S.heavy.map(
 ([p,w])=>'<span class="heavy">'+p+' '+word(p)+' ('+w.toFixed(2)+')</span>').join(', ')||'—');
if(S.evicted.length)s+='<br><b>Evicted</b>: '+S.evicted.length+' positions no layer holds any more (struck through '+
 'in the text).';
if(S.quality)s+='<br><b>Against the full cache</b>: mean KL '+S.quality[0].toFixed(4)+' nats, top-1 agreement '+
 pct(S.quality[1])+' (teacher-forced); greedy output diverges '+(S.quality[2]<0?'never':'at token '+S.quality[2])+'.';
document.getElementById('att-summary').innerHTML=s;
const Dd=S.distance;document.getElementById('att-distance').innerHTML=bars(Dd.map(d=>d[1]),{cls:'dist',bw:34,h:80,
 fill:()=>'#E68C3C',title:k=>'query − key distance '+Dd[k][0]+': '+Dd[k][1]+'% of the attention (run mean)'})+
 '<div class="note">buckets: '+Dd.map(d=>d[0]).join(' · ')+'</div>';
"""

SECTION = Section(
    name="attention", order=45,
    heading="Attention: what each new token looked at, per layer (mean over heads; brighter = more weight; hover a "
            "cell for its weight)",
    body='<div class="note"><label>Selected token: <input type="range" id="att-step" min="0" value="0"></label> '
         '<span id="att-head"></span></div><div class="wide" id="att-map"></div>'
         '<div class="note">The text up to the selected token (highlighted):</div><div class="out" id="att-text">'
         '</div><div class="note" id="att-summary"></div><div class="note">Attention against distance (% of the '
         'run mean, by query − key distance)</div><div class="wide" id="att-distance"></div>',
    script=SCRIPT, data=attention_data,
    style=TABLE_STYLE + ".attmap{border-collapse:collapse;font-size:10px}.attmap td{width:10px;height:12px;padding:0;"
                  "background:#000004}.attmap th{font-weight:normal;color:#555;padding:0 3px;text-align:right}"
                  ".attmap th.pos{text-align:left;padding:0}.att-sel{background:#ffe066}"
                  ".att-gone{color:#999;text-decoration:line-through}#att-step{vertical-align:middle}")
