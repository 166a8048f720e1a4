"""The logit lens: each layer's entropy over the steps, a heat map (low entropy pale, high dark)."""

from __future__ import annotations

from typing import Any

from playground.events import LayerStep
from playground.state.text import visible_token_text
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

LENS_STOPS = ("#FFFFE5", "#FEC44F", "#EC7014", "#993404")


def lens_data(events: list[Any]) -> dict[str, Any] | None:
    steps = [e for e in events if isinstance(e, LayerStep)]
    if not steps:
        return None
    return {"stops": list(LENS_STOPS),
            "steps": [{"step": e.step, "h": [None if h is None else compact(h, 3) for h in e.layer_entropy],
                       "top": [visible_token_text(c[0].text) if c else "" for c in e.layer_top]} for e in steps]}


SCRIPT = """
const L=S.steps,n=L[0].h.length;let max=0;L.forEach(c=>c.h.forEach(v=>{if(v!=null&&v>max)max=v;}));
const mix=(a,b,f)=>{const p=x=>[1,3,5].map(k=>parseInt(x.substr(k,2),16));const A=p(a),B=p(b);
 return 'rgb('+A.map((v,k)=>Math.round(v+(B[k]-v)*f)).join(',')+')';};
const col=v=>{const C=S.stops,f=Math.min(1,v/(max||1))*(C.length-1),k=Math.min(C.length-2,Math.floor(f));
 return mix(C[k],C[k+1],f-k);};
let h='<table>';for(let l=n-1;l>=0;l--){h+='<tr><th>L'+(l+1)+'</th>';L.forEach(c=>{const v=c.h[l];
 h+=v==null?'<td></td>':'<td style="background:'+col(v)+'" title="step '+c.step+' · layer '+(l+1)+' · '+v+
 ' bits · top '+esc(c.top[l])+'"></td>';});h+='</tr>';}
document.getElementById('lens').innerHTML=h+'</table>';
"""

SECTION = Section(
    name="lens", order=10,
    heading="Logit lens: entropy of each layer's prediction (bits; darker = less sure)",
    body='<div class="wide" id="lens"></div>', script=SCRIPT, data=lens_data,
    style=".lens table,#lens table{border-collapse:collapse;font-size:11px}#lens td{width:18px;height:14px}"
          "#lens th{font-weight:normal;color:#555;padding-right:4px;text-align:right}")
