"""A steered run (``--steer FILE[:STRENGTH]``), as the steering view shows it: each vector with its strength (also
relative to the steered blocks' residual norm), the representation reading (decoder blocks × tokens, the residual's
projection onto the vector's unit direction, red along it, blue against it), each token's strength and, with
``--steer-compare``, its steered and unsteered probability and the KL between the two distributions (a table and
two charts), and the median residual norms the relative strength divides by."""

from __future__ import annotations

from typing import Any

from playground.events.steering import SteeringStarted
from playground.state.steering import SteeringState, format_strengths
from playground.state.text import visible_token_text
from playground.ui.web_page.charts import CHART_JS, CHART_STYLE, NEGATIVE, POSITIVE, ZERO, numbers
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

CHANGE_COLOR = "#AA3377"  # a live strength change, as the view marks it


def steering_data(events: list[Any]) -> dict[str, Any] | None:
    if not any(isinstance(e, SteeringStarted) for e in events):
        return None
    state = SteeringState()
    for e in events:
        state.apply(e)
    started = state.started
    assert isinstance(started, SteeringStarted)
    vectors = []
    for i, v in enumerate(started.vectors):
        span = state.relative_range(v.strength, i)
        vectors.append({"name": v.name or v.source, "method": v.method, "strength": v.strength,
                        "blocks": list(v.layers), "relative": None if span is None else numbers(span, 5),
                        "map": [numbers(row, 4) for row in state.projection_map(i).tolist()]})
    changes = {c.token for c in state.changes}
    tokens = [[visible_token_text(t.text) if t.text is not None else "…", format_strengths(t.steer.strengths),
               *numbers((t.steer.steered_prob, t.steer.unsteered_prob, t.steer.kl), 7), int(k in changes)]
              for k, t in enumerate(state.tokens)]
    norms = state.norms
    mean_kl, perplexity = state.mean_kl(), state.unsteered_perplexity()
    return {"vectors": vectors, "layers": list(started.layers), "compare": state.compared, "tokens": tokens,
            "norms": None if norms is None else {"layers": list(norms.layers),
                                                 "values": numbers(norms.residual_norms, 7),
                                                 "positions": norms.positions},
            "mean_kl": None if mean_kl is None else compact(mean_kl, 7),
            "perplexity": None if perplexity is None else compact(perplexity, 7),
            "target_only": started.target_only, "stops": [NEGATIVE, ZERO, POSITIVE], "change": CHANGE_COLOR}


SCRIPT = CHART_JS + r"""
const T=S.tokens,n=T.length;
let h='<b>Steering</b>';S.vectors.forEach(v=>{const b=v.blocks.length>1?'blocks '+v.blocks[0]+'–'+
 v.blocks[v.blocks.length-1]:v.blocks.length?'block '+v.blocks[0]:'no block';const r=v.relative;
 h+=' · '+esc(v.name)+(v.method?', '+esc(v.method):'')+' × '+(v.strength>=0?'+':'')+v.strength+(r?' = '+
 (Math.abs(r[0]-r[1])<=0.005*Math.abs(r[1])?r[0].toFixed(2):r[0].toFixed(2)+'–'+r[1].toFixed(2))+
 '× ‖h‖ at its blocks':'')+' on '+b;});
h+=' · '+n+' tokens';const head=document.getElementById('steer-head');head.innerHTML=h;head.title=S.target_only;
let m='';S.vectors.forEach((v,vi)=>{const M=v.map;let top=0;M.forEach(r=>r.forEach(x=>{if(x!=null&&Math.abs(x)>top)
 top=Math.abs(x);}));
 // as the view's colour scale: the largest |projection| rounded up to 2 significant digits
 if(top>0){const sc=Math.pow(10,Math.floor(Math.log10(top))-1);top=Math.ceil(top/sc)*sc;}else top=1;
 m+='<div class="note">read along <b>'+esc(v.name)+'</b> (scale ±'+(+top.toPrecision(2))+')</div><div class="wide">'+
 '<table class="heat steer-map" data-vector="'+vi+'">';
 for(let l=M.length-1;l>=0;l--){m+='<tr><th>block '+S.layers[l]+'</th>';M[l].forEach((x,k)=>{
  const ch=T[k]&&T[k][5]?' style="border-left:2px solid '+S.change+'"':'';
  m+=x==null?'<td'+ch+'></td>':'<td style="background:'+ramp(S.stops,0.5+x/(2*top))+(ch?';border-left:2px solid '+
  S.change:'')+'" title="block '+S.layers[l]+' · token '+k+' '+esc(T[k]?T[k][0]:'')+' · projection '+x+'"></td>';});
  m+='</tr>';}
 m+='<tr><th></th>'+T.map(t=>'<th class="tk">'+esc(t[0].slice(0,3))+'</th>').join('')+'</tr></table></div>';});
document.getElementById('steer-map').innerHTML=m;
const pc=v=>v==null?'—':pct(v);
let t='<div class="wide"><table class="num steer-table"><tr><th>#</th><th>token</th><th>strength</th>'+
 '<th>p steered</th><th>p unsteered</th><th>KL (nats)</th></tr>';
T.forEach((r,k)=>{t+='<tr><td>'+k+'</td><td>'+esc(r[0])+'</td><td'+
 (r[5]?' style="color:'+S.change+'" title="live strength change"':'')+'>'+esc(r[1])+'</td><td>'+pc(r[2])+'</td><td>'+
 pc(r[3])+'</td><td>'+(r[4]==null?'—':r[4].toFixed(4))+'</td></tr>';});
document.getElementById('steer-table').innerHTML=t+'</table></div>';
let c='';if(S.compare){const lab=T.map(r=>r[0]);
 c+=chart({n,lo:0,hi:1.05,labels:lab,ylabel:'p',xlabel:'chosen token\'s p: steered (orange) · unsteered (blue, dashed)',
  series:[{kind:'line',color:'#EE7733',cls:'steered',pts:T.map((r,k)=>[k,r[2],'token '+k+' '+r[0]+': p steered '+
  pc(r[2])])},{kind:'line',color:'#0077BB',dash:'5 3',cls:'unsteered',pts:T.map((r,k)=>[k,r[3],'token '+k+' '+r[0]+
  ': p unsteered '+pc(r[3])])}]});
 const K=T.map(r=>r[4]||0);c+=chart({n,lo:0,hi:Math.max(1e-3,...K)*1.1,labels:lab,ylabel:'nats',
  xlabel:'KL(steered ‖ unsteered)',series:[{kind:'bars',color:'#009988',cls:'kl',pts:T.map((r,k)=>[k,r[4],
  'token '+k+' '+r[0]+': KL '+(r[4]==null?'—':r[4].toFixed(4))+' nats'])}]});
 c='<div class="note" id="steer-compare">Against the unsteered model (same tokens, its own cache): mean '+
  'KL(steered ‖ unsteered) <b>'+(S.mean_kl==null?'—':S.mean_kl.toFixed(4))+'</b> nats · the text\'s perplexity '+
  'under the unsteered model <b>'+(S.perplexity==null?'—':S.perplexity.toFixed(2))+'</b></div><div class="charts">'+
  c+'</div>';}
else c='<div class="note" id="steer-compare">Unsteered comparison off: run with --steer-compare to see each '+
 'token\'s unsteered probability and the KL between the two distributions.</div>';
if(S.norms&&S.norms.layers.length){const P=S.norms.layers.map((l,k)=>'block '+l+': '+S.norms.values[k].toFixed(1));
 c+='<div class="note" id="steer-norms">Median residual norm ‖h‖ over the prompt\'s '+S.norms.positions+
  ' positions after the first (what the relative strength divides by; position 0, the attention sink, is left out): '+
  (P.length<=4?P.join(', '):P[0]+' … '+P[P.length-1])+'</div>';}
document.getElementById('steer-figures').innerHTML=c;
"""

SECTION = Section(
    name="steering", order=41,
    heading="Steering: where the model is along each vector (blocks × tokens; red along it, blue against it) and "
            "what the vector did to each token",
    body='<div class="note" id="steer-head"></div><div id="steer-map"></div><div class="note">'
         f'<span class="sw" style="background:{POSITIVE}"></span>along the vector <span class="sw" '
         f'style="background:{NEGATIVE}"></span>against it · white: neither. A cell: block N\'s output where the '
         "token was predicted (before N's own vector is added) · the vector's unit direction; hover for it.</div>"
         '<div id="steer-table"></div><div id="steer-figures"></div>',
    script=SCRIPT, data=steering_data,
    style=CHART_STYLE + ".heat th.tk{font-size:9px;color:#777}")
