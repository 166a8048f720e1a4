"""A watermarked run (``--watermark kirchenbauer`` or ``synthid``), as the watermark view shows it: the scheme and
its verdict (the last running z against the threshold, its p-value), each token on its colour (green / red; SynthID:
its mean g-value between them; grey: not scored) with its numbers on hover, and the running z-score with the
threshold, each step's entropy beside its colour and the watermark's KL, step by step."""

from __future__ import annotations

import math
from typing import Any

from playground.events.watermark import WatermarkStarted
from playground.state.text import flowing_token_text
from playground.state.watermark import WatermarkState
from playground.ui.web_page.charts import CHART_JS, CHART_STYLE, numbers
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section

# The watermark view's colours (ui/views/watermark/colours.py), not imported: that package draws with pyqtgraph
GREEN, RED, UNSCORED = "#44AA66", "#CC4455", "#BBBBBB"
LOW_ENTROPY_BITS = 2.0  # the view's split of the scored tokens by entropy
ALPHA = 150  # the view lays its colours at this alpha over the text's white


def mark_colour(scored: bool, colour: float, synthid: bool) -> str:
    """A token's background as the view's ``colour_of``: red to green by the colour (SynthID's mean g-value
    stretched ×2.5 about ½), grey when not scored; as CSS, with the view's alpha."""
    if not scored:
        return UNSCORED
    t = (colour - 0.5) * 2.5 + 0.5 if synthid else colour
    t = min(max(t, 0.0), 1.0)
    red, green = (tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in (RED, GREEN))
    r, g, b = (round(a + (z - a) * t) for a, z in zip(red, green, strict=True))
    return f"rgba({r},{g},{b},{ALPHA / 255:.3f})"


def split_text(synthid: bool, n_low: int, low: float, n_high: int, high: float) -> str:
    """The view's words for the scored tokens' colour below and above the entropy split (its own number format)."""
    if not (n_low or n_high):
        return ""

    def share(n: int, v: float) -> str:
        return f"{v:.0%} of {n}" if n else "none"

    return (f"{'mean g' if synthid else 'green'}: {share(n_low, low)} below {LOW_ENTROPY_BITS:g} bits of entropy, "
            f"{share(n_high, high)} at or above (low-entropy tokens carry little of the signal)")


def watermark_data(events: list[Any]) -> dict[str, Any] | None:
    if not any(isinstance(e, WatermarkStarted) for e in events):
        return None
    state = WatermarkState()
    for e in events:
        state.apply(e)
    started = state.started
    assert isinstance(started, WatermarkStarted)
    synthid = started.scheme != "kirchenbauer"
    tokens = [[flowing_token_text(t.text or "") or "·", t.mark.step, mark_colour(t.mark.scored, t.mark.colour, synthid),
               int(t.mark.scored), compact(t.mark.colour, 7), "".join(map(str, t.mark.g_values)),
               *numbers((t.mark.z_score, t.mark.entropy, t.mark.kl), 7)] for t in state.tokens]
    last = state.last
    verdict = None
    if last is not None and math.isfinite(last.z_score):
        verdict = {"z": compact(last.z_score, 7), "p": f"{last.p_value:.2e}", "count": last.count,
                   "detected": last.z_score > state.threshold}
    (n_low, low), (n_high, high) = state.split_by_entropy(LOW_ENTROPY_BITS)
    kl = state.mean_kl()
    return {"scheme": started.scheme, "summary": started.summary, "threshold": started.threshold,
            "colours": [GREEN, RED, UNSCORED], "tokens": tokens, "verdict": verdict,
            "kl": None if kl is None else compact(kl, 7),
            "split": split_text(synthid, n_low, low, n_high, high)}


SCRIPT = CHART_JS + r"""
const T=S.tokens,syn=S.scheme!=='kirchenbauer',V=S.verdict;
let h='<b>'+(syn?'SynthID-Text':'green lists (Kirchenbauer et al.)')+'</b>: '+esc(S.summary);
if(V)h+=' · <span id="wm-verdict">z = <b>'+V.z.toFixed(2)+'</b> (threshold '+S.threshold+'), p = '+V.p+' over '+
 V.count+' scored tokens: <b>'+(V.detected?'watermarked':'not (yet) detected')+'</b></span>';
if(S.kl!=null)h+=' · mean KL(watermarked ‖ model) = '+S.kl.toFixed(3)+' nats/token';
if(S.split)h+=' · '+esc(S.split);
document.getElementById('wm-head').innerHTML=h;
document.getElementById('wm-legend').innerHTML=syn?swatch(S.colours[1],'mean g-value 0')+swatch(S.colours[0],
 'mean g-value 1')+swatch(S.colours[2],'not scored'):swatch(S.colours[0],'green')+swatch(S.colours[1],'red')+
 swatch(S.colours[2],'not scored');
const f=(v,d)=>v==null?'—':v.toFixed(d);
const tip=t=>'step '+t[1]+': '+(syn?'g-values '+t[5]+' (mean '+t[4].toFixed(2)+')':(t[4]>=1?'green':'red'))+
 (t[3]?'':' (not scored: a repeated context or a skipped call)')+(t[7]!=null?', entropy '+t[7].toFixed(2)+' bits':'')+
 (t[8]!=null?', KL '+t[8].toFixed(3)+' nats':'')+'; z so far '+f(t[6],2);
const box=document.getElementById('wm-text');T.forEach(t=>{const s=document.createElement('span');
 s.className='wmtok';s.textContent=t[0];s.style.background=t[2];s.title=tip(t);box.appendChild(s);});
const lab=T.map(t=>t[0]),n=T.length,zs=T.map(t=>t[6]).filter(v=>v!=null);
const zlo=Math.min(0,...zs),zhi=Math.max(S.threshold,...zs)*1.05;
let c=chart({n,lo:zlo,hi:zhi,labels:lab,ylabel:'z',xlabel:'running z-score',hlines:[{y:S.threshold,color:'#888',
 label:'threshold '+S.threshold}],series:[{kind:'line',color:'#0077BB',cls:'z',pts:T.map((t,k)=>[k,t[6],
 'step '+t[1]+': z '+f(t[6],2)])}]});
const H=T.map(t=>t[7]||0);c+=chart({n,lo:0,hi:Math.max(1,...H)*1.05,labels:lab,ylabel:'bits',
 xlabel:'entropy beside the colour',series:[{kind:'bars',cls:'ent',pts:T.map((t,k)=>[k,t[7],'step '+t[1]+
 ': entropy '+f(t[7],2)+' bits',t[2]])}]});
const K=T.map(t=>t[8]).filter(v=>v!=null);if(K.length)c+=chart({n,lo:0,hi:Math.max(1e-3,...K)*1.1,labels:lab,
 ylabel:'nats',xlabel:'KL(watermarked ‖ model)',series:[{kind:'dots',color:'#009988',cls:'kl',pts:T.map((t,k)=>
 [k,t[8],'step '+t[1]+': KL '+f(t[8],3)+' nats'])}]});
document.getElementById('wm-charts').innerHTML=c;
"""

SECTION = Section(
    name="watermark", order=40,
    heading="Watermark: each token's colour, the running z-score against the threshold, the entropy beside each "
            "colour and the watermark's KL (hover for the numbers)",
    body='<div class="note" id="wm-head"></div><div class="note" id="wm-legend"></div>'
         '<div class="out" id="wm-text"></div><div class="charts" id="wm-charts"></div>',
    script=SCRIPT, data=watermark_data,
    style=CHART_STYLE)
