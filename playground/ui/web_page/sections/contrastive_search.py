"""Contrastive search (Su et al. 2022): α and k, the strip of steps (red where the degeneration penalty overturned
the model's top choice), and each step's k candidates with the model's confidence, the penalty, the earlier token
each resembles most and the combined score (hover or tap a step), as the contrastive-search view gives them."""

from __future__ import annotations

from typing import Any

from playground.events.contrastive_search import SearchStarted, SearchStep
from playground.state.text import visible_token_text
from playground.ui.web_page.charts import TABLE_STYLE
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

OVERTURNED_COLOR = "#CC3311"
KEPT_COLOR = "#BBBBBB"


def search_data(events: list[Any]) -> dict[str, Any] | None:
    from playground.state.contrastive_search import ContrastiveSearchState

    started = next((e for e in events if isinstance(e, SearchStarted)), None)
    if started is None or not any(isinstance(e, SearchStep) for e in events):
        return None
    fold = ContrastiveSearchState()
    for e in events:
        fold.apply(e)
    searched = [s for s in fold.steps if not s.forced]
    return {
        "alpha": started.alpha, "k": started.k, "searched": len(searched), "overturned": fold.overturned,
        "share": fold.overturned_fraction(),
        # per step: its text, overturned, forced, winner, candidates [text, p, penalty, most similar text, where,
        # score]
        "steps": [[visible_token_text(s.text), int(s.overturned), int(s.forced), s.winner,
                   [[visible_token_text(c.text), compact(c.confidence, 4), compact(c.penalty, 4),
                     visible_token_text(fold.most_similar_text(c)), fold.describe_position(c.similar_position),
                     compact(c.score, 4)] for c in s.candidates]] for s in fold.steps],
        "colors": [OVERTURNED_COLOR, KEPT_COLOR], "start": fold.most_interesting_step(),
    }


SCRIPT = """
document.getElementById('cs-head').textContent='α = '+S.alpha+' · k = '+S.k+' · the penalty overturned the model\\'s '+
 'top choice at '+S.overturned+' of '+S.searched+' steps ('+Math.round(100*S.share)+' %)';
const St=S.steps,strip=document.getElementById('cs-strip'),cand=document.getElementById('cs-cand');
let h='';St.forEach((s,k)=>{h+='<span class="sstep'+(s[1]?' over':'')+'" data-k="'+k+'" style="background:'+
 (s[1]?S.colors[0]:S.colors[1])+'" title="step '+k+': took '+esc(s[0])+(s[2]?' (forced)':
 s[1]?' over the model\\'s top '+esc(s[4][0][0]):' (the model\\'s top)')+'">'+esc(s[0])+'</span>';});strip.innerHTML=h;
function show(k){const s=St[k],a=S.alpha;strip.querySelectorAll('.sstep').forEach(e=>e.classList.toggle('sel',
 +e.dataset.k===k));let t='<b>Step '+k+'</b>: the '+s[4].length+' candidates, likeliest first · took '+esc(s[0])+' · '+
 (s[2]?'forced':s[1]?'the penalty overturned the model\\'s top choice':'the model\\'s top choice won')+' · score = '+
 (+(1-a).toPrecision(2))+'·p − '+(+a.toPrecision(2))+'·penalty'+
 '<table class="vtab"><tr><th></th><th>token</th><th>p</th>'+
 '<th>penalty</th><th>most like</th><th>score</th></tr>';
 s[4].forEach((c,i)=>{t+='<tr class="scand'+(i===s[3]?' win':'')+'"><td>'+(i===0?'▲':'')+(i===s[3]?'★':'')+
 '</td><td class="t">'+esc(c[0])+'</td><td>'+pct(c[1])+'</td><td>'+c[2].toFixed(3)+'</td><td class="t">'+esc(c[3])+
 ' ('+esc(c[4])+')</td><td>'+(c[5]>=0?'+':'')+c[5].toFixed(3)+'</td></tr>';});cand.innerHTML=t+'</table>';}
strip.addEventListener('mouseover',e=>{if(e.target.dataset.k)show(+e.target.dataset.k);});
strip.addEventListener('click',e=>{if(e.target.dataset.k)show(+e.target.dataset.k);});show(S.start);
"""

SECTION = Section(
    name="search", order=60,
    heading="Contrastive search: where the degeneration penalty overturned the model's top choice",
    body='<div class="note" id="cs-head"></div><div class="note">'
         f'<span style="background:{OVERTURNED_COLOR}">&nbsp;&nbsp;</span> overturned · '
         f'<span style="background:{KEPT_COLOR}">&nbsp;&nbsp;</span> not · ▲ the model\'s top choice · ★ the winner '
         '(green row) · hover or tap a step for its candidates</div><div class="out" id="cs-strip"></div>'
         '<div class="wide" id="cs-cand"></div>',
    script=SCRIPT, data=search_data,
    style=TABLE_STYLE + ".sstep{cursor:pointer;margin-right:1px;border-radius:2px}.sstep.over{color:#fff}"
                  ".sstep.sel{outline:2px solid #FFD84D}.scand.win{background:#DFF0D8}")
