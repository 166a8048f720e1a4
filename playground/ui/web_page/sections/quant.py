"""The quantization lab (``--quant METHOD --compare``): what was built, the per-token KL(reference ‖ quantized) under
teacher forcing as bars (× where the quantized model's top token differs, a dashed line where the free-running
outputs diverge), each layer's relative weight error, and the methods table. The two panes themselves are the
side-by-side section's.

"""

from __future__ import annotations

from typing import Any

from playground.events.quant import QuantReady, QuantStep, QuantSummary, QuantTable
from playground.state.text import visible_token_text
from playground.ui.web_page.charts import BARS, TABLE_STYLE
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _outlier_ratio(values: tuple[float, ...]) -> float | None:
    """The largest channel over the median channel (as the quantization view's note gives it)."""
    import numpy as np

    if not values:
        return None
    v = np.asarray(values, dtype=float)
    return compact(float(v.max() / max(float(np.median(v)), 1e-12)), 3)


def quant_data(events: list[Any]) -> dict[str, Any] | None:
    from playground.state.quant import QuantState

    ready = next((e for e in events if isinstance(e, QuantReady)), None)
    if ready is None:
        return None
    steps = [e for e in events if isinstance(e, QuantStep)]
    summary = next((e for e in events if isinstance(e, QuantSummary)), None)
    table = next((e for e in events if isinstance(e, QuantTable)), None)
    group = f", group {ready.group_size}" if ready.group_size else ", per channel"
    ratio = ready.reference_weight_bytes / ready.weight_bytes if ready.weight_bytes else 0.0
    built = "from the cache" if ready.cached else f"built in {ready.seconds:.1f} s"
    header = [f"{ready.method}{group}: weights stored as {ready.stored}, {_mb(ready.weight_bytes)} vs "
              f"{_mb(ready.reference_weight_bytes)} {ready.reference_dtype}"
              f"{f' ({ratio:.1f}× smaller)' if ratio > 1.05 else ''} · {built}"]
    if ready.perplexity:
        header.append("perplexity on the evaluation text: " +
                      " · ".join(f"{name} {value:.2f}" for name, value in ready.perplexity.items()))
    if ready.note:
        header.append(ready.note)
    fold = QuantState()
    fold.apply(ready)
    kinds, series = fold.layer_errors_by_layer()
    layers = max((len(v) for v in series.values()), default=0)
    return {
        "header": header,
        # step, reference token, KL, p_reference, p_quantized (of the reference's token), quantized top, agrees
        "steps": [[s.step, visible_token_text(s.text), compact(s.kl, 4), compact(s.reference_prob, 4),
                   compact(s.quantized_prob, 4), visible_token_text(s.quantized_top_text), int(s.top1_agrees)]
                  for s in steps],
        "summary": None if summary is None else {
            "median": compact(summary.kl_median, 4), "p99": compact(summary.kl_p99, 4),
            "first": summary.first_divergence, "ref_tps": round(summary.reference_tokens_per_s, 1),
            "q_tps": round(summary.quantized_tokens_per_s, 1)},
        "kinds": kinds,
        # per decoder layer (1 first), per kind: ‖W_q − W‖ / ‖W‖ (None: the layer has no such kind)
        "errors": [[None if series[k][i] != series[k][i] else compact(float(series[k][i]), 4) for k in kinds]
                   for i in range(layers)],
        # per representative layer: its name, the largest channel's max |x| over the median channel's, before and
        # after the method's scaling, and how many scales it has (none: plain round-to-nearest)
        "channels": [[c.name, _outlier_ratio(c.act_max_before), _outlier_ratio(c.act_max_after), len(c.scales)]
                     for c in ready.channels],
        "table": [[r.method, r.stored, _mb(r.weight_bytes), "" if r.perplexity is None else f"{r.perplexity:.2f}",
                   f"{r.tokens_per_s:.1f}", f"{r.kl_mean:.4f}", r.top1_agreement,
                   "—" if r.method == "reference" else "never" if r.first_divergence < 0
                   else str(r.first_divergence + 1)] for r in (table.rows if table is not None else ())],
    }


SCRIPT = BARS + """
document.getElementById('quant-head').innerHTML=S.header.map((l,k)=>k?'<div class="note">'+esc(l)+'</div>':
 '<b>'+esc(l)+'</b>').join('');
const St=S.steps;
if(St.length){const kl=St.map(s=>s[2]),mean=kl.reduce((a,b)=>a+b,0)/kl.length,agree=St.filter(s=>s[6]).length;
 let t='teacher-forced over '+St.length+' tokens: mean KL '+mean.toFixed(4)+' nats, max '+Math.max(...kl).toFixed(3)+
 ' · top-1 agreement '+pct(agree/St.length);const m=S.summary;
 if(m)t+=' · median '+m.median.toFixed(4)+', p99 '+m.p99.toFixed(3)+' · free-running: '+(m.first<0?'never diverged':
 'first divergence at token '+(m.first+1))+' · '+m.ref_tps+' vs '+m.q_tps+' tok/s';
 document.getElementById('quant-figures').textContent=t;
 document.getElementById('quant-kl').innerHTML=bars(kl,{cls:'kl',bw:14,h:90,fmt:v=>v.toPrecision(2),
  fill:k=>St[k][6]?'#0077BB':'#CC3311',marks:St.map((s,k)=>s[6]?-1:k).filter(k=>k>=0),
  vline:m&&m.first>=0?m.first:null,vtitle:'the free-running outputs diverge here',
  title:k=>{const s=St[k];return 'step '+s[0]+' '+s[1]+' · KL '+s[2]+' nats · reference p '+pct(s[3])+
  ' · quantized p '+pct(s[4])+' · quantized top '+s[5]+(s[6]?'':' (differs)');}});}
if(S.errors.length){let h='<table class="vtab"><tr><th>layer</th>'+S.kinds.map(k=>'<th>'+esc(k.replace(/_proj$/,''))+
 '</th>').join('')+'</tr>';const all=S.errors.flat().filter(v=>v!=null),
 lo=Math.min(...all),span=Math.max(1e-12,Math.max(...all)-lo);
 S.errors.forEach((r,i)=>{h+='<tr><th>'+(i+1)+'</th>'+r.map((v,k)=>v==null?'<td></td>':'<td class="err" title="layer '+
 (i+1)+' · '+esc(S.kinds[k])+' · ‖W_q − W‖ / ‖W‖ = '+v+'" style="background:rgba(204,51,17,'+
 (0.08+0.6*(v-lo)/span).toFixed(2)+
 ')">'+v.toFixed(3)+'</td>').join('')+'</tr>';});document.getElementById('quant-errors').innerHTML=h+'</table>';}
if(S.channels.length){let h='<table class="vtab"><tr><th>input of</th><th>largest / median channel, before '+
 'scaling</th><th>after</th><th>scales</th></tr>';S.channels.forEach(c=>{h+='<tr class="chan"><td class="t">'+
 esc(c[0])+'</td><td>'+(c[1]==null?'—':c[1]+'×')+'</td><td>'+(c[2]==null?'—':c[2]+'×')+'</td><td>'+(c[3]||
 'none: plain round-to-nearest')+'</td></tr>';});document.getElementById('quant-channels').innerHTML=
 '<div class="note">Outlier channels on the calibration text: max |x| of the largest input channel over the '+
 'median one</div>'+h+'</table>';}
if(S.table.length){let h='<table class="vtab"><tr>'+['method','stored','weights','perplexity','tokens/s','mean KL',
 'top-1 agreement','first divergence'].map(c=>'<th>'+c+'</th>').join('')+'</tr>';
 S.table.forEach(r=>{h+='<tr class="method">'+r.map((c,k)=>'<td'+(k<2?' class="t"':'')+'>'+esc(k===6?pct(c):String(c))+
 '</td>').join('')+'</tr>';});document.getElementById('quant-table').innerHTML=h+'</table>';}
"""

SECTION = Section(
    name="quant", order=40,
    heading="Quantization lab: the reference against its quantized copy (its two panes: the side-by-side part "
            "above)",
    body='<div id="quant-head"></div><div class="note" id="quant-figures"></div>'
         '<div class="note">KL(reference ‖ quantized) in nats at each token, teacher-forced (0 = the same '
         'distribution); '
         '<b style="color:#CC3311">×</b> red: the quantized model\'s top token differs; dashed: the free-running '
         'outputs diverge. Hover a bar for its numbers.</div><div class="wide" id="quant-kl"></div>'
         '<div class="note">Each layer\'s relative weight error ‖W_q − W‖ / ‖W‖, by kind (darker: larger, '
         'from the least to the largest)</div>'
         '<div class="wide" id="quant-errors"></div><div class="wide" id="quant-channels"></div>'
         '<div class="wide" id="quant-table"></div>',
    script=SCRIPT, data=quant_data, style=TABLE_STYLE)
