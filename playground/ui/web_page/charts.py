"""What the page's sections share: the app's diverging colour ends; ``CHART_JS``, a small chart (lines, dots, bars
over the tokens or layers, as an SVG that shrinks to a phone's width) and a heat map's colours (steering, watermark,
why this token, salience, patching); ``BARS``, a bar chart with marks and threshold lines (quant, cascade,
attention); and their CSS. A section's script starts with the JavaScript it uses."""

from __future__ import annotations

from typing import Any

from playground.ui.web_page.common import compact

# ColorBrewer's RdBu ends and middle, as the steering map, the salience rows and the patching maps draw them
NEGATIVE, ZERO, POSITIVE = "#2166AC", "#F7F7F7", "#B2182B"


def numbers(values: Any, digits: int = 4) -> list[float | None]:
    """Compact numbers; None stays None (and so does a NaN, which JSON cannot hold)."""
    return [None if v is None or v != v else compact(float(v), digits) for v in values]


CHART_JS = r"""
const hex=x=>[1,3,5].map(k=>parseInt(x.substr(k,2),16));
// a colour along stops C at f in 0..1, mixed linearly in RGB (as pyqtgraph's ColorMap)
const ramp=(C,f)=>{f=Math.max(0,Math.min(1,isFinite(f)?f:0.5));const g=f*(C.length-1),
 k=Math.min(C.length-2,Math.floor(g)),A=hex(C[k]),B=hex(C[k+1]),t=g-k;
 return 'rgb('+A.map((v,i)=>Math.round(v+(B[i]-v)*t)).join(',')+')';};
// o: {n (x positions 0..n-1), lo, hi (y range), labels (x tick texts), ylabel, series: [{kind: line|dots|bars,
//  color, dash, cls, off, bw, pts: [[x, y, title]]}], hlines: [{y, color, label}]}: an SVG, as wide as its points
function chart(o){const n=Math.max(1,o.n),w=Math.max(300,Math.min(960,(o.px||22)*n)),h=o.h||120,L=48,T=10,B=18;
 const span=(o.hi-o.lo)||1,X=x=>L+(x+0.5)*w/n,Y=v=>T+h*(o.hi-v)/span;
 let g='<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="'+(L+w+10)+'" height="'+(T+h+B)+
  '" viewBox="0 0 '+(L+w+10)+' '+(T+h+B)+'">';
 g+='<rect x="'+L+'" y="'+T+'" width="'+w+'" height="'+h+'" fill="#fff" stroke="#ccc"/>';
 const tick=v=>Math.abs(v)>=100?v.toFixed(0):Math.abs(v)>=10?v.toFixed(1):v.toFixed(2);
 g+='<text x="'+(L-4)+'" y="'+(T+9)+'" font-size="10" text-anchor="end">'+tick(o.hi)+'</text><text x="'+(L-4)+
  '" y="'+(T+h)+'" font-size="10" text-anchor="end">'+tick(o.lo)+'</text>';
 if(o.ylabel)g+='<text x="2" y="'+(T+h/2)+'" font-size="10" fill="#555">'+o.ylabel+'</text>';
 if(o.lo<0&&o.hi>0)g+='<line x1="'+L+'" x2="'+(L+w)+'" y1="'+Y(0)+'" y2="'+Y(0)+'" stroke="#999"/>';
 (o.hlines||[]).forEach(l=>{g+='<line class="hline" x1="'+L+'" x2="'+(L+w)+'" y1="'+Y(l.y)+'" y2="'+Y(l.y)+
  '" stroke="'+l.color+'" stroke-dasharray="5 3"><title>'+esc(l.label)+'</title></line>';});
 (o.series||[]).forEach(s=>{const P=s.pts.filter(p=>p[1]!=null&&isFinite(p[1])),off=s.off||0,cls=s.cls||'pt';
  if(s.kind==='line'&&P.length>1)g+='<polyline fill="none" stroke="'+s.color+'" stroke-width="2"'+
   (s.dash?' stroke-dasharray="'+s.dash+'"':'')+' points="'+P.map(p=>X(p[0]+off)+','+Y(p[1])).join(' ')+'"/>';
  P.forEach(p=>{const c=p[3]||s.color;if(s.kind==='bars'){const bw=(s.bw||0.8)*w/n,y0=Y(Math.max(o.lo,0)),
   y1=Y(p[1]);g+='<rect class="'+cls+'" x="'+(X(p[0]+off)-bw/2)+'" y="'+Math.min(y0,y1)+'" width="'+bw+
   '" height="'+Math.max(0.5,Math.abs(y1-y0))+'" fill="'+c+'"><title>'+esc(p[2])+'</title></rect>';}
   else g+='<circle class="'+cls+'" cx="'+X(p[0]+off)+'" cy="'+Y(p[1])+'" r="'+(s.r||3)+'" fill="'+c+
    '"><title>'+esc(p[2])+'</title></circle>';});});
 const every=Math.max(1,Math.ceil(n*40/w));(o.labels||[]).forEach((t,k)=>{if(k%every)return;
  g+='<text x="'+X(k)+'" y="'+(T+h+13)+'" font-size="10" text-anchor="middle">'+esc(String(t).slice(0,5))+'</text>';});
 return '<div class="fig">'+g+'</svg>'+(o.xlabel?'<div class="cap">'+o.xlabel+'</div>':'')+'</div>';}
// a swatch: a coloured box and its words
const swatch=(c,t)=>'<span class="sw" style="background:'+c+'"></span>'+t;
"""

CHART_STYLE = (".chart{max-width:100%;height:auto;display:block}.fig{flex:1 1 300px;min-width:0;margin-bottom:6px}"
               ".cap{font-size:11px;color:#555;text-align:center}.charts{display:flex;flex-wrap:wrap;gap:8px}"
               ".sw{display:inline-block;width:11px;height:11px;"
               "margin:0 3px 0 8px;vertical-align:middle;border:1px solid #999}"
               ".heat{border-collapse:collapse;font-size:11px}.heat td{min-width:16px;height:14px;padding:0}"
               ".heat th{font-weight:normal;color:#555;padding:0 4px;text-align:right;white-space:nowrap}"
               ".heat thead th{text-align:center;padding:0 1px;font-size:10px}"
               ".note{color:#555;font-size:.9em;margin:4px 0}.num td{padding:1px 8px;text-align:right}"
               ".num td:nth-child(2){text-align:left}.num{font-size:.9em}"
               "@media (max-width:600px){.num td,.num th{padding:1px 3px}.num{font-size:.8em}}")


# bars(V, o): one bar per value (null: none), bars o.bw px wide (at least 240 px in all), o.h px high, on a scale
# from 0 to o.max (default: the largest value); o.fill(k) and o.title(k) colour and name bar k, o.cls its class;
# o.line {v, color, title}: a dashed horizontal line at v; o.marks: the bars to mark with × above; o.vline: the bar
# to draw a dashed vertical line through; o.fmt: how the top of the scale is written.
BARS = """
const bars=(V,o)=>{const n=V.length,bw=o.bw||12,w=Math.max(240,bw*n),h=o.h||90,L=44,T=8;
 const top=o.max||Math.max(1e-12,...V.filter(v=>v!=null));const y=v=>T+h-h*Math.max(0,Math.min(v,top))/top;
 const f=o.fmt||(v=>String(+v.toPrecision(3)));
 let g='<svg xmlns="http://www.w3.org/2000/svg" class="bars" width="'+(L+w+6)+'" height="'+(T+h+18)+'">'+
 '<text x="'+(L-4)+'" y="'+(T+8)+'" font-size="10" text-anchor="end">'+f(top)+'</text><text x="'+(L-4)+'" y="'+
 (T+h)+'" font-size="10" text-anchor="end">0</text><line x1="'+L+'" y1="'+(T+h)+'" x2="'+(L+w)+'" y2="'+(T+h)+
 '" stroke="#888"/>';
 V.forEach((v,k)=>{if(v==null)return;const x=L+k*w/n;g+='<rect class="'+(o.cls||'bar')+'" data-k="'+k+'" x="'+
 (x+0.1*w/n).toFixed(1)+'" y="'+y(v).toFixed(1)+'" width="'+(0.8*w/n).toFixed(1)+'" height="'+
 Math.max(0.5,T+h-y(v)).toFixed(1)+'" fill="'+(o.fill?o.fill(k):'#0077BB')+'"><title>'+(o.title?o.title(k):v)+
 '</title></rect>';});
 (o.marks||[]).forEach(k=>{g+='<text class="mark" x="'+(L+(k+0.5)*w/n)+'" y="'+(T+7)+
 '" font-size="11" font-weight="bold" text-anchor="middle" fill="#CC3311">×</text>';});
 if(o.vline!=null){const x=L+(o.vline+0.5)*w/n;g+='<line class="vline" x1="'+x+'" y1="'+T+'" x2="'+x+'" y2="'+(T+h)+
 '" stroke="#CC3311" stroke-width="2" stroke-dasharray="4 3"><title>'+esc(o.vtitle||'')+'</title></line>';}
 if(o.line){g+='<line class="hline" x1="'+L+'" y1="'+y(o.line.v)+'" x2="'+(L+w)+'" y2="'+y(o.line.v)+'" stroke="'+
 (o.line.color||'#333')+'" stroke-dasharray="5 3"><title>'+esc(o.line.title||'')+'</title></line>';}
 return g+'</svg>';};
"""

# The number tables and notes of the quant, cascade, attention and contrastive sections.
TABLE_STYLE = (".vtab{border-collapse:collapse;font-size:12px;margin-bottom:6px}"
         ".vtab td,.vtab th{padding:1px 6px;text-align:right}"
         ".vtab th{font-weight:normal;color:#555}.vtab td.t{text-align:left;font-family:monospace}"
         ".note{color:#555;font-size:.9em;margin:4px 0}")
