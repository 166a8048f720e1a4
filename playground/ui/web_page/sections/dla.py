"""Why this token, as the view shows it: the uncertainty strip (each step's entropy and varentropy, its dot coloured
by entropix's quadrant), the commitment strip (a run with the lens: the first layer from which the lens keeps each
emitted token at top-1 and within its top 5) and each attributed step's logit difference (``--attribute-steps``,
``--attribute-word``): the chosen token over its alternative, split over each layer's attention and MLP, the running
sum across layers against the logit lens's own difference, and each head's share."""

from __future__ import annotations

from typing import Any

import numpy as np

from playground.events import LayerStep
from playground.events.dla import AttributionMissing, LogitAttribution
from playground.state.dla import QUADRANTS, DlaFold
from playground.state.text import visible_token_text
from playground.ui.style import PROCESSED_COLOR, RAW_COLOR
from playground.ui.web_page.charts import CHART_JS, CHART_STYLE, NEGATIVE, POSITIVE, ZERO, numbers
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

# The view's quadrant colours (ui/views/dla/view.py), not imported: that module draws with pyqtgraph
QUADRANT_COLORS = {"flowing": "#009988", "careful": "#0077BB", "forks": "#EE7733", "mist": "#CC3311",
                   "middle": "#BBBBBB"}
VIRIDIS = ("#440154", "#3B528B", "#21918C", "#5EC962", "#FDE725")  # the commitment strip's map: early dark, late yellow


def attribution(a: LogitAttribution) -> dict[str, Any]:
    heads = np.array(a.heads, dtype=float)
    return {"step": a.step, "token": visible_token_text(a.token_text), "against": visible_token_text(a.against_text),
            "diff": compact(a.difference, 7), "capped": compact(a.capped_difference, 7), "softcap": a.softcap,
            "emb": compact(a.embeddings, 7), "attn": numbers(a.attention, 7), "mlp": numbers(a.mlp, 7),
            "heads": [numbers(row, 3) for row in heads.tolist()], "bias": compact(a.norm_bias, 7),
            "other": compact(sum(a.other), 7), "running": numbers(a.running, 6), "lens": numbers(a.lens, 6),
            "linearisation": a.linearisation}


def dla_data(events: list[Any]) -> dict[str, Any] | None:
    # Every run of tokens has the uncertainty strip; the page shows this part for a run that recorded the lens or
    # attributed a step (else a plain run's page would carry a second strip of what its tokens' hover shows)
    if not any(isinstance(e, LayerStep | LogitAttribution | AttributionMissing) for e in events):
        return None
    state = DlaFold()
    for e in events:
        state.apply(e)
    return {"steps": [[visible_token_text(s.text), compact(s.entropy, 7),
                       None if s.varentropy is None else compact(s.varentropy, 7), s.quadrant] for s in state.steps],
            "commit": [[c.step, c.top1, c.topk] for c in state.commitments], "layers": state.layers,
            "attributions": [attribution(state.attributions[k]) for k in sorted(state.attributions)],
            "missing": state.missing, "quadrants": QUADRANTS, "qcolors": QUADRANT_COLORS, "viridis": list(VIRIDIS),
            "stops": [NEGATIVE, ZERO, POSITIVE], "colors": [RAW_COLOR, PROCESSED_COLOR]}


SCRIPT = CHART_JS + r"""
const St=S.steps,n=St.length,lab=St.map(s=>s[0]);
const counted={};St.forEach(s=>{if(s[3])counted[s[3]]=(counted[s[3]]||0)+1;});
const quads=Object.entries(counted).sort((a,b)=>b[1]-a[1]).map(([q,k])=>k+' '+q).join(', ');
const top1=S.commit.map(c=>c[1]).filter(v=>v!=null).sort((a,b)=>a-b);
const med=top1.length?(top1.length%2?top1[(top1.length-1)/2]:(top1[top1.length/2-1]+top1[top1.length/2])/2):null;
const late=top1.filter(v=>S.layers&&v>0.75*S.layers).length;
document.getElementById('dla-head').textContent=n+' steps: '+(quads||'varentropy not recorded')+(med!=null?
 '; committed (top-1 kept) at layer '+Math.round(med)+' of '+S.layers+' on median, '+late+' of '+S.commit.length+
 ' only in the last quarter':'; commitment: record the lens (--lens)')+'; '+S.attributions.length+' attributed.';
const f=(v,d)=>v==null?'—':(v>=0?'+':'')+v.toFixed(d);
let g='';if(n){const vals=St.flatMap(s=>[s[1],s[2]]).filter(v=>v!=null);
 g=chart({n,lo:0,hi:Math.max(1,...vals)*1.05,labels:lab,ylabel:'H, V',xlabel:'entropy H (bits, blue) · varentropy V '+
  '(bits², dashed) · dots: quadrant',series:[{kind:'line',color:S.colors[0],cls:'h',pts:St.map((s,k)=>[k,s[1],''])},
  {kind:'line',color:'#444',dash:'4 3',cls:'v',pts:St.map((s,k)=>[k,s[2],''])},{kind:'dots',r:4,cls:'quad',
  pts:St.map((s,k)=>[k,s[1],'step '+k+' '+s[0]+': H '+s[1].toFixed(3)+' bits'+(s[2]!=null?', V '+s[2].toFixed(3)+
  ' bits², '+s[3]:''),S.qcolors[s[3]||'middle']])}]});
 g+='<div class="note">'+Object.entries(S.quadrants).map(([q,t])=>swatch(S.qcolors[q],esc(t))).join(' ')+'</div>';}
document.getElementById('dla-uncertainty').innerHTML=g;
let cm='';if(S.commit.length&&n){const by={};S.commit.forEach(c=>{by[c[0]]=c;});
 const cell=(k,r)=>{const c=by[k],v=c?c[r]:null,what=r===1?'top-1':'top-5';
  if(!c)return '<td></td>';if(v==null)return '<td class="cm never" style="background:#ccc" title="step '+k+' '+
  esc(lab[k])+': never kept at '+what+'"></td>';return '<td class="cm" style="background:'+
  ramp(S.viridis,(v-1)/Math.max(1,S.layers-1))+'" title="step '+k+' '+esc(lab[k])+': '+what+' kept from layer '+v+
  ' of '+S.layers+'"></td>';};
 cm='<div class="note">Commitment: the first layer from which the lens keeps the emitted token (dark: early, '+
  'yellow: late, grey: never)</div><div class="wide"><table class="heat dla-commit"><tr><th>top-1</th>';
 for(let k=0;k<n;k++)cm+=cell(k,1);cm+='</tr><tr><th>top-5</th>';for(let k=0;k<n;k++)cm+=cell(k,2);
 cm+='</tr></table></div>';}
document.getElementById('dla-commit').innerHTML=cm;
const A=S.attributions,pick=document.getElementById('dla-pick');
function draw(a){const nl=a.attn.length,L=a.attn.map((_,i)=>'L'+(i+1));
 const big=v=>v.map((x,i)=>[i,x]).sort((p,q)=>Math.abs(q[1])-Math.abs(p[1])).slice(0,2).map(p=>'L'+(p[0]+1)+' '+
  f(p[1],2)).join(', ');
 let top=0,best=[0,0];a.heads.forEach((r,l)=>r.forEach((x,hd)=>{if(x!=null&&Math.abs(x)>top){top=Math.abs(x);
  best=[l,hd];}}));
 const sum=v=>v.reduce((s,x)=>s+(x||0),0);
 document.getElementById('dla-summary').textContent='Step '+a.step+': \''+a.token+'\' over \''+a.against+'\' by Δ '+
  f(a.diff,3)+' logits'+(a.softcap?'; after soft-capping at '+a.softcap+': '+f(a.capped,3):'')+' = embeddings '+
  f(a.emb,3)+' + attention '+f(sum(a.attn),3)+' + MLP '+f(sum(a.mlp),3)+' + norm bias '+f(a.bias,3)+
  (Math.abs(a.other)>1e-3?'; other writes (steering) '+f(a.other,3):'')+'. Largest attention: '+big(a.attn)+
  '; MLP: '+big(a.mlp)+'; head L'+(best[0]+1)+'H'+best[1]+' '+f(a.heads.length?a.heads[best[0]][best[1]]:0,2)+
  '. Linearised: '+a.linearisation+'.';
 const bars=[...a.attn,...a.mlp].filter(v=>v!=null);
 let c=chart({n:nl,px:44,lo:Math.min(0,...bars)*1.1,hi:Math.max(0,...bars)*1.1||1,labels:L,ylabel:'A − B',
  xlabel:'each layer\'s attention (blue) and MLP (orange) write, logits',series:[{kind:'bars',bw:0.38,off:-0.2,
  color:S.colors[0],cls:'attn',pts:a.attn.map((x,i)=>[i,x,'layer '+(i+1)+' attention '+f(x,4)])},{kind:'bars',
  bw:0.38,off:0.2,color:S.colors[1],cls:'mlp',pts:a.mlp.map((x,i)=>[i,x,'layer '+(i+1)+' MLP '+f(x,4)])}]});
 const run=[...a.running,...a.lens].filter(v=>v!=null);
 c+=chart({n:nl,px:44,lo:Math.min(0,...run)*1.1,hi:Math.max(0,...run)*1.1||1,labels:L,ylabel:'so far',
  xlabel:'running sum (frozen norm, black) · logit lens (blue, dashed)',series:[{kind:'line',color:'#222',
  cls:'running',pts:a.running.map((x,i)=>[i,x,'after layer '+(i+1)+': running sum '+f(x,4)])},{kind:'dots',
  color:'#222',cls:'running',pts:a.running.map((x,i)=>[i,x,'after layer '+(i+1)+': running sum '+f(x,4)])},
  {kind:'line',color:S.colors[0],dash:'5 3',cls:'lens',pts:a.lens.map((x,i)=>[i,x,''])},{kind:'dots',r:2,
  color:S.colors[0],cls:'lens',pts:a.lens.map((x,i)=>[i,x,'layer '+(i+1)+': logit lens '+f(x,4)])}]});
 document.getElementById('dla-bars').innerHTML=c;
 const nh=a.heads.length?a.heads[0].length:0;let t='<div class="note">Each head\'s share of A − B (red raises \''+
  esc(a.token)+'\', blue raises \''+esc(a.against)+'\'; scale ±'+(top||1).toPrecision(2)+')</div><div class="wide">'+
  '<table class="heat dla-heads">';
 for(let hd=nh-1;hd>=0;hd--){t+='<tr><th>H'+hd+'</th>';a.heads.forEach((r,l)=>{const x=r[hd];
  t+='<td style="background:'+ramp(S.stops,0.5+(x||0)/(2*(top||1)))+'" title="L'+(l+1)+'H'+hd+' '+f(x,3)+'"></td>';});
  t+='</tr>';}
 t+='<tr><th></th>'+L.map(x=>'<th>'+x+'</th>').join('')+'</tr></table></div>';
 document.getElementById('dla-heads').innerHTML=t;}
if(A.length){A.forEach((a,k)=>{const o=document.createElement('option');o.value=k;o.textContent='step '+a.step+': \''+
 a.token+'\' over \''+a.against+'\'';pick.appendChild(o);});pick.value=A.length-1;
 pick.addEventListener('change',()=>draw(A[+pick.value]));draw(A[A.length-1]);}
else{pick.hidden=true;document.getElementById('dla-summary').textContent=S.missing.join('; ')||
 'No step attributed: run with --attribute-steps (or --attribute-word) to split a step\'s logit difference by layer.';}
"""

SECTION = Section(
    name="dla", order=42,
    heading="Why this token: where the model hesitated, when it committed, and which layers and heads pushed a token "
            "over its alternative (hover for the numbers)",
    body='<div class="note" id="dla-head"></div><div id="dla-uncertainty"></div><div id="dla-commit"></div>'
         '<div class="note">Attributed step <select id="dla-pick"></select></div><div class="note" id="dla-summary">'
         '</div><div class="charts" id="dla-bars"></div><div id="dla-heads"></div>',
    script=SCRIPT, data=dla_data,
    style=CHART_STYLE + "#dla-pick{max-width:100%}")
