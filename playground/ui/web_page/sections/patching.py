"""Activation patching (``--strategy patching --corrupted PROMPT``), as the patching view shows it: the clean and
corrupted prompts, the metric (logit(answer) − logit(foil) at the last position, clean and corrupted), and one heat
map per patched activation (residual stream, attention output, MLP output): blocks up the side, positions along the
bottom, each cell the share of the difference the clean activation there brings back, on a diverging scale clamped
to −1..1 (the exact share on hover)."""

from __future__ import annotations

from typing import Any

import numpy as np

from playground.events.patching import MAP_TITLES, PatchingRow, PatchingStarted
from playground.state.text import visible_token_text
from playground.ui.web_page.charts import CHART_JS, CHART_STYLE, NEGATIVE, POSITIVE, ZERO, numbers
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section


def patching_data(events: list[Any]) -> dict[str, Any] | None:
    started = next((e for e in events if isinstance(e, PatchingStarted)), None)
    if started is None:
        return None
    values = {kind: np.full((started.layers, len(started.clean_ids)), np.nan) for kind in started.maps}
    seconds = dict.fromkeys(started.maps, 0.0)
    for e in events:
        if isinstance(e, PatchingRow) and e.map in values:
            values[e.map][e.layer] = e.recovered
            seconds[e.map] += e.seconds
    return {"clean": [visible_token_text(t) for t in started.clean_tokens],
            "corrupted": [visible_token_text(t) for t in started.corrupted_tokens],
            "answer": visible_token_text(started.answer_text), "foil": visible_token_text(started.foil_text),
            "clean_diff": compact(started.clean_diff, 7), "corrupted_diff": compact(started.corrupted_diff, 7),
            "differ": list(started.differ), "titles": MAP_TITLES,
            "maps": [{"kind": kind, "rows": [numbers(row, 4) for row in v.tolist()],
                      "seconds": compact(seconds[kind], 3)} for kind, v in values.items()],
            "stops": [NEGATIVE, ZERO, POSITIVE]}


SCRIPT = CHART_JS + r"""
const C=S.clean,X=S.corrupted,tick=k=>C[k]===X[k]?C[k]:C[k]+'/'+X[k];
document.getElementById('patch-head').innerHTML='Clean <b>'+esc(C.join(''))+'</b> → corrupted <b>'+esc(X.join(''))+
 '</b> (positions '+S.differ.join(', ')+' differ; ticks read clean/corrupted there). Metric: logit(\''+esc(S.answer)+
 '\') − logit(\''+esc(S.foil)+'\') at the last position: clean '+S.clean_diff.toFixed(2)+', corrupted '+
 S.corrupted_diff.toFixed(2)+'. A cell: (patched − corrupted) / (clean − corrupted), the clean activation at that '+
 'block and position written into the corrupted run.';
let h='',notes=[];S.maps.forEach(M=>{const R=M.rows;let done=0,best=null;
 h+='<div class="pmap" data-map="'+M.kind+'"><div class="note"><b>Patched: '+esc(S.titles[M.kind])+'</b></div>'+
  '<div class="wide"><table class="heat patch">';
 for(let b=R.length-1;b>=0;b--){if(R[b].every(v=>v!=null))done++;h+='<tr><th>'+b+'</th>';R[b].forEach((v,p)=>{
  if(v!=null&&(best==null||v>best))best=v;h+=v==null?'<td></td>':'<td style="background:'+
  ramp(S.stops,(Math.max(-1,Math.min(1,v))+1)/2)+'" title="'+esc(S.titles[M.kind])+' · block '+b+' · position '+p+
  ' '+esc(tick(p))+' · recovered '+v+'"></td>';});h+='</tr>';}
 h+='<tr><th>block</th>'+C.map((_,p)=>'<th class="tk">'+esc(tick(p).slice(0,5))+'</th>').join('')+
  '</tr></table></div></div>';
 notes.push(S.titles[M.kind]+': '+done+'/'+R.length+' blocks, '+M.seconds.toFixed(1)+' s, most recovered '+
  (best==null?'nan':best.toFixed(2)));});
document.getElementById('patch-maps').innerHTML=h;
document.getElementById('patch-note').textContent=notes.join('; ')+'. Residual: the stream entering each block '+
 '(block 0: the embeddings); attention and MLP: each block\'s output before the residual add.';
document.getElementById('patch-legend').innerHTML=swatch(S.stops[0],'−1')+swatch(S.stops[1],'0')+
 swatch(S.stops[2],'1: all of the difference brought back');
"""

SECTION = Section(
    name="patching", order=44,
    heading="Activation patching: the share of the logit difference each clean activation brings back to the "
            "corrupted run (hover a cell for it)",
    body='<div class="note" id="patch-head"></div><div class="note" id="patch-legend"></div>'
         '<div class="pmaps" id="patch-maps"></div><div class="note" id="patch-note"></div>',
    script=SCRIPT, data=patching_data,
    style=CHART_STYLE + ".pmaps{display:flex;flex-wrap:wrap;gap:12px}.pmap{min-width:0;max-width:100%}"
                        ".patch td{min-width:22px;height:16px}.heat th.tk{font-size:9px;color:#777;"
                        "writing-mode:vertical-rl;transform:rotate(180deg);text-align:left}")
