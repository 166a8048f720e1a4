"""A beam search: the tree as an SVG (survivors bold, finished hypotheses diamonds, numbers on hover) and the
returned sequences, best first."""

from __future__ import annotations

from typing import Any

from playground.events import RunFinished
from playground.events.beam import BeamStep
from playground.state.text import visible_token_text
from playground.ui.web_page.common import compact
from playground.ui.web_page.sections import Section


def beam_tree(events: list[Any]) -> dict[str, Any]:
    """The tree as nodes (step, row, text, log-prob, score, survived, finished, finished score) and edges (child
    node, parent node; -1: the prompt), each step's candidates in the order the run recorded them."""
    nodes: list[list[Any]] = []
    edges: list[list[int]] = []
    survivors: list[int] = []  # node of each running beam after the previous step (the prompt: none)
    for e in (e for e in events if isinstance(e, BeamStep)):
        mine: dict[tuple[int, int], int] = {}
        for row, c in enumerate(e.candidates):
            node = len(nodes)
            nodes.append([e.step, row, visible_token_text(c.text), compact(c.token_logprob, 4), compact(c.score, 4),
                          int(c.survived), int(c.finished),
                          None if c.finished_score is None else compact(c.finished_score, 4)])
            edges.append([node, survivors[c.beam] if c.beam < len(survivors) else -1])
            if c.survived:
                mine.setdefault((c.beam, c.token_id), node)
        survivors = [mine.get((parent, token), -1) for parent, token in zip(e.parents, e.token_ids, strict=True)]
    return {"nodes": nodes, "edges": edges}


def beam_data(events: list[Any]) -> dict[str, Any] | None:
    finished = next((e for e in events if isinstance(e, RunFinished)), None)
    sequences = [{"text": q.text, "score": compact(q.score), "logp": compact(q.sum_logprobs)}
                 for q in (finished.sequences if finished is not None else ())]
    tree = beam_tree(events)
    if not tree["nodes"] and not sequences:
        return None
    return {**tree, "sequences": sequences}


SCRIPT = """
if(S.nodes.length){const N=S.nodes,dx=90,dy=22,pad=40;
 const steps=Math.max(...N.map(n=>n[0]))+1,rows=Math.max(...N.map(n=>n[1]))+1;
 const X=n=>pad+dx*(n[0]+1),Y=n=>12+dy*n[1],P=[pad,12+dy*(rows-1)/2];
 let g='<svg xmlns="http://www.w3.org/2000/svg" width="'+(pad+dx*(steps+1)+60)+'" height="'+(24+dy*rows)+'">';
 S.edges.forEach(([c,p])=>{const n=N[c],a=p<0?P:[X(N[p]),Y(N[p])];g+='<line x1="'+a[0]+'" y1="'+a[1]+
 '" x2="'+X(n)+'" y2="'+Y(n)+'" stroke="'+(n[5]?'#444':'#bbb')+'" stroke-width="'+(n[5]?2:1)+'"/>';});
 g+='<rect x="'+(P[0]-6)+'" y="'+(P[1]-6)+'" width="12" height="12" fill="#222"><title>the prompt</title></rect>';
 N.forEach(n=>{g+='<g class="node'+(n[5]?' survived':'')+(n[6]?' finished':'')+'"><title>step '+n[0]+' · '+esc(n[2])+
 ' · token log-prob '+n[3]+' · beam score '+n[4]+(n[7]!=null?' · finished, score '+n[7]:'')+'</title>'+
 (n[6]?'<rect x="'+(X(n)-5)+'" y="'+(Y(n)-5)+'" width="10" height="10" fill="#00897B" transform="rotate(45 '+X(n)+
 ' '+Y(n)+')"/>':'<circle cx="'+X(n)+'" cy="'+Y(n)+'" r="'+(n[5]?6:3)+'" fill="'+(n[5]?'#8C96C6':'#bbb')+
 '" stroke="#333" stroke-width="'+(n[5]?1:0)+'"/>')+'<text x="'+(X(n)+8)+'" y="'+(Y(n)+4)+'" font-size="11" fill="'+
 (n[5]?'#222':'#999')+'">'+esc(n[2])+'</text></g>';});
 document.getElementById('tree').innerHTML=g+'</svg>';}
if(S.sequences.length){let h='<table class="seq"><tr><th>#</th><th>score</th><th>log p</th><th>text</th></tr>';
 S.sequences.forEach((q,k)=>{h+='<tr><td>'+(k+1)+'</td><td>'+q.score+'</td><td>'+q.logp+'</td><td>'+esc(q.text)+
 '</td></tr>';});document.getElementById('beams').innerHTML=h+'</table>';}
"""

SECTION = Section(
    name="beam", order=20,
    heading="Beam search: the tree (bold: the beams that survived each step; ◆ a finished hypothesis; hover a node "
            "for its numbers) and the returned sequences, best first",
    body='<div class="wide" id="tree"></div><div id="beams"></div>', script=SCRIPT, data=beam_data,
    style=".seq td{padding:2px 8px;vertical-align:top}")
