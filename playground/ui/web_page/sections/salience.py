"""Prompt salience (``--salience``, or Explain step in the window: the maps are kept with the run), as the salience
view shows it: for each explained step and each method, the context with each token's background coloured by its
score (red raised the step's token, blue lowered it; each row on its own scale, ±its largest |score|), the score
on hover, then the methods' rank agreement (Spearman's ρ) and where two disagree."""

from __future__ import annotations

from typing import Any

from playground.events.salience import DISAGREE_BELOW, METHOD_TITLES, SalienceAgreement, SalienceMap
from playground.state.text import visible_token_text
from playground.ui.web_page.charts import CHART_STYLE, NEGATIVE, POSITIVE, numbers
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

COMPLETENESS_SHARE = 0.1  # as the view: integrated gradients' sum further than this share from its target warns


def salience_data(events: list[Any]) -> dict[str, Any] | None:
    steps: dict[int, dict[str, Any]] = {}
    for e in events:
        if isinstance(e, SalienceMap):
            step = steps.setdefault(e.step, {"step": e.step, "maps": {}, "agreement": None})
            step.update(target=visible_token_text(e.target_text), logprob=compact(e.target_logprob, 7),
                        baseline=e.baseline)
            gap, expected = e.figures.get("completeness_gap"), e.figures.get("expected_sum")
            warned = None
            if gap is not None and expected is not None and abs(gap) > COMPLETENESS_SHARE * max(abs(expected), 1e-6):
                warned = [compact(e.figures["sum"], 7), compact(expected, 7), compact(gap, 7)]
            step["maps"][e.method] = {
                "tokens": [visible_token_text(t) for t in e.tokens], "scores": numbers(e.scores, 7),
                "prompt": e.prompt_tokens, "detail": e.detail, "seconds": compact(e.seconds, 2),
                "warn": warned}
        elif isinstance(e, SalienceAgreement) and e.step in steps:
            steps[e.step]["agreement"] = {"pairs": [list(p) for p in e.pairs], "rho": numbers(e.rho, 7)}
    if not steps:
        return None
    return {"steps": [steps[k] for k in sorted(steps)], "titles": METHOD_TITLES, "below": DISAGREE_BELOW,
            "colors": [POSITIVE, NEGATIVE]}


SCRIPT = r"""
const mix=(c,s)=>{s=Math.max(0,Math.min(1,s));return 'rgb('+[1,3,5].map(k=>Math.round(255+(parseInt(c.substr(k,2),16)
 -255)*s)).join(',')+')';};
const sign=(v,d)=>(v>=0?'+':'')+v.toFixed(d);
const box=document.getElementById('sal'),pick=document.getElementById('sal-pick');
function draw(st){let h='<div class="note">Step '+st.step+': why <b>'+esc("'"+st.target+"'")+'</b> (log p '+
 st.logprob.toFixed(3)+' under the raw model). Baseline '+esc(st.baseline)+'.</div>';
 Object.entries(st.maps).forEach(([m,M])=>{const top=Math.max(0,...M.scores.map(v=>Math.abs(v||0)));
  h+='<div class="sal-row" data-method="'+m+'"><div><b>'+esc(S.titles[m])+'</b> — '+esc(M.detail)+' ('+
   M.seconds.toFixed(1)+' s)</div><div class="out">';
  M.tokens.forEach((t,k)=>{if(k===M.prompt)h+='<span class="edge">│</span>';const v=M.scores[k];
   h+='<span class="stok" style="background:'+(top>0&&v!=null?mix(v>0?S.colors[0]:S.colors[1],Math.abs(v)/top):
   '#fff')+'" title="'+(v==null?'—':sign(v,3))+'">'+esc(t)+'</span>';});
  h+='<span class="edge"> (±'+(+top.toPrecision(3))+' nats)</span></div>';
  if(M.warn)h+='<div class="warn"><b>Not converged:</b> the scores add up to '+M.warn[0].toFixed(2)+', not '+
   M.warn[1].toFixed(2)+' (off by '+sign(M.warn[2],2)+'); raise the IG steps (--ig-steps) or read occlusion instead.'+
   '</div>';h+='</div>';});
 const A=st.agreement;if(A){const L=A.pairs.map((p,k)=>S.titles[p[0]]+' ~ '+S.titles[p[1]]+': ρ = '+
  (A.rho[k]==null?'nan':sign(A.rho[k],2)));let t='Rank agreement (Spearman): '+L.join('; ')+'.';
  const dis=A.pairs.map((p,k)=>[p,A.rho[k]]).filter(([p,r])=>r!=null&&r<S.below);
  dis.forEach(([p,r])=>{const first=m=>{const M=st.maps[m];let b=0;M.scores.forEach((v,k)=>{if(v>M.scores[b])b=k;});
   return M.tokens[b];};t+='<br><b>'+S.titles[p[0]]+' and '+S.titles[p[1]]+' disagree</b> (ρ '+sign(r,2)+' &lt; '+
   S.below+'): they rank the context differently; most salient '+esc("'"+first(p[0])+"'")+' vs '+
   esc("'"+first(p[1])+"'")+'.';});
  if(!dis.length&&L.length)t+=' The methods agree (every ρ ≥ '+S.below+').';h+='<div class="note" id="sal-agree">'+t+
  '</div>';}
 box.innerHTML=h;}
if(S.steps.length>1){S.steps.forEach((st,k)=>{const o=document.createElement('option');o.value=k;
 o.textContent='step '+st.step+': '+st.target;pick.appendChild(o);});
 pick.addEventListener('change',()=>draw(S.steps[+pick.value]));}else pick.hidden=true;
pick.value=S.steps.length-1;draw(S.steps[S.steps.length-1]);
"""

SECTION = Section(
    name="salience", order=43,
    heading="Prompt salience: which context tokens made a step's token likely, by each method (hover a token for "
            "its score)",
    body='<select id="sal-pick"></select><div id="sal"></div><div class="note">'
         f'<span class="sw" style="background:{POSITIVE}"></span>raised log p(token) <span class="sw" '
         f'style="background:{NEGATIVE}"></span>lowered it · each row on its own scale (±its largest |score|, in '
         "nats of log p) · │ ends the prompt</div>",
    script=SCRIPT, data=salience_data,
    style=CHART_STYLE + f".edge{{color:#555}}.warn{{color:{NEGATIVE}}}.sal-row{{margin:6px 0}}")
