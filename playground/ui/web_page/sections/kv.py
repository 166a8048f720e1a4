"""The KV cache: its measured size after the prompt and after each step, a line with a point per step."""

from __future__ import annotations

from typing import Any

from playground.events import PrefillDone, is_unit_step
from playground.ui.web_page.sections import Section


def kv_data(events: list[Any]) -> list[int] | None:
    sizes = ([next((e.kv_cache_bytes for e in events if isinstance(e, PrefillDone)), 0)] +
             [e.kv_cache_bytes for e in events if is_unit_step(e)])
    return sizes if len(sizes) > 1 else None


SCRIPT = """
const K=S,w=Math.max(300,Math.min(900,8*K.length)),h=90,m=Math.max(...K)||1;
const mb=v=>(v/1048576).toFixed(2)+' MB';let g='<svg xmlns="http://www.w3.org/2000/svg" width="'+(w+70)+
 '" height="'+(h+20)+'"><text x="0" y="12" font-size="11">'+mb(m)+'</text><text x="0" y="'+h+
 '" font-size="11">0</text>';const x=k=>60+k*w/Math.max(1,K.length-1),y=v=>h-(h-10)*v/m;
g+='<polyline fill="none" stroke="#0077BB" stroke-width="2" points="'+K.map((v,k)=>x(k)+','+y(v)).join(' ')+'"/>';
K.forEach((v,k)=>{g+='<circle class="kv" cx="'+x(k)+'" cy="'+y(v)+'" r="3" fill="#0077BB"><title>'+
 (k===0?'after the prompt':'after step '+(k-1))+': '+mb(v)+'</title></circle>';});
document.getElementById('kv').innerHTML=g+'</svg>';
"""

SECTION = Section(
    name="kv", order=90, heading="KV cache: its measured size after the prompt and after each step",
    body='<div class="wide" id="kv"></div>', script=SCRIPT, data=kv_data)
