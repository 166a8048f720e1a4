"""Cascade inference: the output coloured by the model that produced each token (▲ where the full model took
over; per response, the cheap model's response struck through when it was thrown away), the cheap model's
confidence per token as bars against the threshold, and the run's figures, as the cascade view gives them."""

from __future__ import annotations

from typing import Any

from playground.events import RunFinished
from playground.events.cascade import CHEAP, FORCED, FULL, CascadeResponse, CascadeStarted, CascadeStep
from playground.state.text import flowing_token_text
from playground.ui.web_page.charts import BARS, TABLE_STYLE
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

# As the cascade view's (Paul Tol's vibrant set): the cheap model teal, the full model blue, forced grey.
COLORS = {CHEAP: "#009988", FULL: "#0077BB", FORCED: "#777777", "discarded": "#CC3311"}
TINTS = {CHEAP: "#D5F0EC", FULL: "#D6E7F4", FORCED: "#EEEEEE", "discarded": "#F8DCD5"}


def _step(s: CascadeStep) -> list[Any]:
    """[text, producer, escalated, cheap's choice, its p, full p, positions the full model read]"""
    return [flowing_token_text(s.text) or "·", s.producer, int(s.escalated), flowing_token_text(s.cheap_text),
            None if s.cheap_prob is None else compact(s.cheap_prob, 4),
            None if s.full_prob is None else compact(s.full_prob, 4), s.full_read]


def cascade_data(events: list[Any]) -> dict[str, Any] | None:
    from playground.state.cascade import CascadeState

    started = next((e for e in events if isinstance(e, CascadeStarted)), None)
    if started is None:
        return None
    fold = CascadeState()
    for e in events:
        fold.apply(e)
    response = next((e for e in events if isinstance(e, CascadeResponse)), None)
    finished = next((e for e in events if isinstance(e, RunFinished)), None)
    figures = dict(finished.figures) if finished is not None else {}
    n = len(fold.output)
    rows = []
    if response is not None:
        verdict = ("below: thrown away, the full model wrote the response" if response.escalated else "not below: kept")
        rows.append(f"Verdict: the cheap response's mean p {response.mean_prob:.3f} over {response.tokens} tokens "
                    f"(lowest {response.min_prob:.3f}) vs threshold {response.threshold:g}: {verdict}")
    if n:
        rows.append(f"Full model: {fold.counts[FULL]} of {n} tokens ({100 * fold.counts[FULL] / n:.1f}%) in "
                    f"{fold.escalations} escalation{'s' * (fold.escalations != 1)} · cheap model: "
                    f"{fold.counts[CHEAP]}" + (f" · forced: {fold.counts[FORCED]}" if fold.counts[FORCED] else ""))
    if fold.full_passes:
        rows.append(f"Full model passes: {fold.full_passes}, reading {fold.full_read} positions (each pass catches up "
                    f"on what it missed; the first reads the prompt) · {fold.full_ms / fold.full_passes:.1f} ms a pass")
    if fold.cheap_steps:
        rows.append(f"Cheap model: {fold.cheap_ms / fold.cheap_steps:.1f} ms a token (its pass and choice)")
    if "identical_fraction" in figures:
        first = int(figures["first_divergence"])
        rows.append(f"Against the full model alone (same prompt and settings): "
                    f"{100 * figures['identical_fraction']:.1f}% of tokens identical · first divergence: "
                    f"{'none' if first < 0 else f'token {first}'}")
        saved = figures["time_saved"]
        rows.append(f"Speed, prompt included (measured): {figures['tokens_per_s_with_prompt']:.1f} tokens/s vs "
                    f"{figures['full_alone_tokens_per_s']:.1f} alone · " +
                    (f"time saved {100 * saved:.1f}%" if saved >= 0 else f"slower: {1 - saved:.2f}× the full "
                                                                         "model's time"))
    rule = (f"the whole response is rewritten by the full model when the cheap model's mean p is below "
            f"{started.threshold:g}" if started.unit == "response" else
            f"a token is decided by the full model when the cheap model's p is below {started.threshold:g}")
    return {
        "header": f"cheap: {started.cheap_detail} · full: {started.full_detail} · {rule}",
        "threshold": started.threshold, "colors": COLORS, "tints": TINTS,
        "output": [_step(s) for s in fold.output],
        "escalations": fold.escalation_steps(),
        # per response: the cheap model's own response, and whether it was thrown away
        "drafts": [_step(s) for s in fold.drafts] if started.unit == "response" else [],
        "discarded": bool(response is not None and response.escalated),
        "figures": rows,
    }


SCRIPT = BARS + """
document.getElementById('cas-head').textContent=S.header;
const C=S.colors,Ti=S.tints,who={cheap:'cheap model',full:'full model',forced:'forced'};
const tip=(s,k,draft)=>(draft?'cheap response token ':'step ')+k+' · '+(draft&&S.discarded?'thrown away':who[s[1]])+
 (s[4]!=null?' · cheap model chose '+s[3]+': p = '+pct(s[4])+(s[4]<S.threshold?' < ':' ≥ ')+
 'threshold '+S.threshold:'')+
 (s[5]!=null?' · full model: p = '+pct(s[5])+' · read '+s[6]+' positions':'');
const span=(s,k,draft)=>{const kind=draft&&S.discarded?'discarded':s[1];return '<span class="cas '+kind+
 '" style="color:'+C[kind]+';background:'+Ti[kind]+'" title="'+esc(tip(s,k,draft))+'">'+esc(s[0])+'</span>';};
let h='';if(S.drafts.length)h+='<div class="note">The cheap model\\'s response'+(S.discarded?' (thrown away)':'')+
 ':</div><div class="out">'+S.drafts.map((s,k)=>S.discarded?'<s>'+span(s,k,true)+'</s>':span(s,k,true)).join('')+
 '</div><div class="note">The output:</div>';
h+='<div class="out">'+S.output.map((s,k)=>(S.escalations.includes(k)?'<b class="esc" style="color:#EE3377">▲</b>':'')+
 span(s,k,false)).join('')+'</div>';document.getElementById('cas-text').innerHTML=h;
const Q=S.drafts.length?S.drafts:S.output;
document.getElementById('cas-strip').innerHTML=bars(Q.map(s=>s[4]),{cls:'conf',bw:14,h:80,max:1,
 fill:k=>S.drafts.length&&S.discarded?C.discarded:C[Q[k][1]],title:k=>tip(Q[k],k,S.drafts.length>0),
 line:{v:S.threshold,color:'#333',title:'threshold '+S.threshold}});
document.getElementById('cas-figures').innerHTML=S.figures.map(esc).join('<br>');
"""

SECTION = Section(
    name="cascade", order=50,
    heading="Cascade: which model produced each token (▲ the full model takes over; hover a token or bar for both "
            "models' figures)",
    body='<div class="note" id="cas-head"></div><div class="note">'
         f'<span style="color:{COLORS[CHEAP]};background:{TINTS[CHEAP]}">&nbsp;cheap model&nbsp;</span> '
         f'<span style="color:{COLORS[FULL]};background:{TINTS[FULL]}">&nbsp;full model&nbsp;</span> '
         f'<span style="color:{COLORS[FORCED]};background:{TINTS[FORCED]}">&nbsp;forced&nbsp;</span> '
         f'<s style="color:{COLORS["discarded"]};background:{TINTS["discarded"]}">&nbsp;thrown away&nbsp;</s></div>'
         '<div id="cas-text"></div><div class="note">The cheap model\'s p for its own choice per token (dashed: '
         'the threshold; under it the full model decides)</div><div class="wide" id="cas-strip"></div>'
         '<div class="note" id="cas-figures"></div>',
    script=SCRIPT, data=cascade_data, style=TABLE_STYLE)
