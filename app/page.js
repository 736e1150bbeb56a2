// The studio's page script, put into <head> by app.py (render.HEAD_JS).
//
// Live frames: while a run streams, the page polls the run's live board (app/live.py) for new token spans, the
// figures' Plotly JSON and the status line. On a small machine the browser shares the cores with the model,
// and a Plotly redraw costs ~10 ms of CPU per plot however little changed (axes, legend, SVG), so live frames
// are drawn from the same JSON onto a canvas over each plot (~1 ms: bars, lines, markers, tau band, ticks,
// legend); the final figures arrive as interactive Plotly plots and the canvases go. With >= 8 cores (or
// ?live=plotly) live frames use Plotly.react in place instead (no resize). Plotly is global once the first
// gr.Plot has rendered. No model text is ever put into this script; token spans arrive escaped (render.py).
(function(){
  var m = /[?&]live=(plotly|canvas)/.exec(location.search);
  var mode = m ? m[1] : ((navigator.hardwareConcurrency || 2) >= 8 ? 'plotly' : 'canvas');
  var PAL = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b'];
  function ticks(lo, hi, n){
    var raw = (hi - lo) / n, p = Math.pow(10, Math.floor(Math.log10(raw))), e = raw / p;
    var step = (e >= 5 ? 10 : e >= 2 ? 5 : e >= 1 ? 2 : 1) * p, out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(+v.toPrecision(6));
    return out;
  }
  function text(t){ return t == null ? '' : (typeof t === 'string' ? t : (t.text || '')); }
  function drawCanvas(gd, fig){
    var box = gd.parentElement, W = gd.offsetWidth, H = gd.offsetHeight;
    if (!W || !H) return;
    if (getComputedStyle(box).position === 'static') box.style.position = 'relative';
    var cv = box.querySelector(':scope > canvas.ssd-live');
    if (!cv) { cv = document.createElement('canvas'); cv.className = 'ssd-live'; box.appendChild(cv); }
    var r = window.devicePixelRatio || 1;
    cv.style.cssText = 'position:absolute;z-index:5;background:#fff;left:' + gd.offsetLeft + 'px;top:' +
      gd.offsetTop + 'px;width:' + W + 'px;height:' + H + 'px';
    if (cv.width !== Math.round(W * r) || cv.height !== Math.round(H * r)) { cv.width = Math.round(W * r); cv.height = Math.round(H * r); }
    var c = cv.getContext('2d'); c.setTransform(r, 0, 0, r, 0, 0); c.clearRect(0, 0, W, H);
    var L = fig.layout || {}, mg = L.margin || {}, data = fig.data || [];
    var l = (mg.l || 40) + 8, rt = mg.r || 10, t = mg.t || 36, b = (mg.b || 36) + 10, pw = W - l - rt, ph = H - t - b;
    var xs = [], ys = [0], bars = false;
    data.forEach(function(d){ (d.x || []).forEach(function(v){ xs.push(+v); }); (d.y || []).forEach(function(v){ ys.push(+v); });
                              if (d.type === 'bar') bars = true; });
    var x0 = xs.length ? Math.min.apply(null, xs) : 0, x1 = xs.length ? Math.max.apply(null, xs) : 1;
    if (bars) { x0 -= 0.5; x1 += 0.5; }
    if (x1 <= x0) x1 = x0 + 1;
    var yr = (L.yaxis || {}).range, y0 = yr ? yr[0] : Math.min.apply(null, ys), y1 = yr ? yr[1] : Math.max.apply(null, ys) * 1.05;
    if (y1 <= y0) y1 = y0 + 1;
    var X = function(v){ return l + (v - x0) / (x1 - x0) * pw; }, Y = function(v){ return t + ph - (v - y0) / (y1 - y0) * ph; };
    c.font = '11px sans-serif'; c.lineWidth = 1;
    c.fillStyle = '#444'; c.textAlign = 'right'; c.textBaseline = 'middle';
    ticks(y0, y1, 4).forEach(function(v){ c.strokeStyle = '#e9ecef'; c.beginPath(); c.moveTo(l, Y(v)); c.lineTo(l + pw, Y(v)); c.stroke();
                                          c.fillText(String(v), l - 4, Y(v)); });
    c.textAlign = 'center'; c.textBaseline = 'top';
    ticks(x0, x1, 6).forEach(function(v){ c.fillText(String(v), X(v), t + ph + 4); });
    (L.shapes || []).forEach(function(s){
      c.save(); c.globalAlpha = s.opacity == null ? 1 : s.opacity;
      if (s.type === 'rect') { c.fillStyle = s.fillcolor || '#ccc'; c.fillRect(l, Y(s.y1), pw, Y(s.y0) - Y(s.y1)); }
      else if (s.type === 'line') { c.strokeStyle = (s.line || {}).color || '#888'; c.setLineDash((s.line || {}).dash ? [5, 4] : []);
                                    c.beginPath(); c.moveTo(l, Y(s.y0)); c.lineTo(l + pw, Y(s.y1)); c.stroke(); }
      c.restore();
    });
    (L.annotations || []).forEach(function(a){ if (a.yref !== 'y') return; c.fillStyle = '#444'; c.textAlign = 'right';
      c.textBaseline = 'bottom'; c.fillText(text(a), l + pw, Y(a.y) - 2); });
    var bw = Math.max(1, 0.8 * pw / (x1 - x0)), legend = [];
    data.forEach(function(d, i){
      var mk = d.marker || {}, ln = d.line || {}, col = ln.color || mk.color || PAL[i % PAL.length];
      var x = d.x || [], y = d.y || [];
      if (d.type === 'bar') {
        c.fillStyle = mk.color || col; c.strokeStyle = (mk.line || {}).color || col;
        for (var j = 0; j < x.length; j++) { var h = Y(0) - Y(y[j]); c.fillRect(X(x[j]) - bw / 2, Y(y[j]), bw, h); if (bw > 3) c.strokeRect(X(x[j]) - bw / 2, Y(y[j]), bw, h); }
      } else {
        var md = d.mode || 'lines';
        if (md.indexOf('lines') >= 0 && x.length) {
          c.strokeStyle = col; c.lineWidth = 2; c.setLineDash(ln.dash === 'dot' ? [2, 3] : ln.dash === 'dash' ? [6, 4] : []);
          c.beginPath(); c.moveTo(X(x[0]), Y(y[0])); for (var j = 1; j < x.length; j++) c.lineTo(X(x[j]), Y(y[j])); c.stroke();
          c.setLineDash([]); c.lineWidth = 1;
        }
        if (md.indexOf('markers') >= 0) { c.fillStyle = mk.color || col;
          for (var j = 0; j < x.length; j++) { c.beginPath(); c.moveTo(X(x[j]), Y(y[j]) - 4); c.lineTo(X(x[j]) + 4, Y(y[j]) + 3); c.lineTo(X(x[j]) - 4, Y(y[j]) + 3); c.fill(); } }
      }
      if (d.name) legend.push([d.name, d.type === 'bar' ? (mk.color || col) : col]);
    });
    c.strokeStyle = '#adb5bd'; c.beginPath(); c.moveTo(l, t); c.lineTo(l, t + ph); c.lineTo(l + pw, t + ph); c.stroke();
    c.fillStyle = '#222'; c.textAlign = 'left'; c.textBaseline = 'alphabetic'; c.font = '13px sans-serif';
    c.fillText(text(L.title), 8, 20);
    c.font = '11px sans-serif'; c.fillStyle = '#444'; c.textAlign = 'right';
    c.fillText(text((L.xaxis || {}).title), l + pw, H - 10);
    var lx = l;
    legend.forEach(function(g){ c.fillStyle = g[1]; c.fillRect(lx, H - 20, 10, 8); c.fillStyle = '#444'; c.textAlign = 'left';
                                c.fillText(g[0], lx + 13, H - 12); lx += 24 + c.measureText(g[0]).width; });
    c.save(); c.translate(11, t + ph / 2); c.rotate(-Math.PI / 2); c.textAlign = 'center'; c.fillText(text((L.yaxis || {}).title), 0, 0); c.restore();
  }
  function draw(figs){
    Object.keys(figs).forEach(function(id){
      var gd = document.querySelector('#' + id + ' .js-plotly-plot');
      if (!gd) return;
      var fig = figs[id];
      if (mode === 'plotly' && window.Plotly) window.Plotly.react(gd, fig.data, fig.layout, {responsive: true, displaylogo: false});
      else drawCanvas(gd, fig);
      window.__ssdLiveFrames = (window.__ssdLiveFrames || 0) + 1;
    });
  }
  // app/live.py: the first Gradio frame names the run; then the board is polled for new token spans (appended
  // when the view still shows exactly the events the answer starts from), live figures and the status line,
  // until the run is done or the final Gradio frame clears the hidden element.
  var run = null;
  function poll(){
    var r = run; if (!r) return;
    var view = document.querySelector('#tokens-view .ssd-tokens');
    var have = view ? parseInt(view.getAttribute('data-n') || '0') : 0;
    fetch(new URL('ssd/live/' + encodeURIComponent(r.token) + '?n=' + have + '&v=' + r.v, location.href), {cache: 'no-store'})
      .then(function(x){ return x.ok ? x.json() : null; })
      .then(function(f){
        if (run !== r) return;                       // a newer run, or the final frame came first
        if (!f) { run = null; return; }
        var view = document.querySelector('#tokens-view .ssd-tokens');
        if (view && f.spans && parseInt(view.getAttribute('data-n') || '0') === f.from) {
          view.insertAdjacentHTML('beforeend', f.spans); view.setAttribute('data-n', f.n);
          window.__ssdTokenDeltas = (window.__ssdTokenDeltas || 0) + 1;
        }
        var st = document.querySelector('#status .ssd-status'); if (st && f.status) st.outerHTML = f.status;
        if (f.figs) { r.v = f.v; draw(f.figs); }
        if (f.done) run = null; else r.timer = setTimeout(poll, r.every);
      }).catch(function(){ if (run === r) r.timer = setTimeout(poll, r.every); });
  }
  function liveChanged(){
    var el = document.querySelector('#live-plots .ssd-run');
    if (!el) {                                       // the final frame: Plotly figures take over
      if (run) { clearTimeout(run.timer); run = null; }
      document.querySelectorAll('canvas.ssd-live').forEach(function(x){ x.remove(); });
      return;
    }
    var token = el.getAttribute('data-run');
    if (run && run.token === token) return;
    if (run) clearTimeout(run.timer);
    run = {token: token, every: parseInt(el.getAttribute('data-every')) || 500, v: 0};
    run.timer = setTimeout(poll, run.every);
  }
  window.__ssdLiveMode = mode;
  new MutationObserver(function(ms){
    for (var i = 0; i < ms.length; i++) {
      var t = ms[i].target;
      if (t.closest && t.closest('#live-plots')) { liveChanged(); return; }
    }
  }).observe(document.documentElement, {childList: true, subtree: true});
})();
// Hovering a copied token highlights its source span in the context (event delegation).
document.addEventListener('mouseover', function(e){
  var t = e.target.closest && e.target.closest('.tok[data-src]');
  document.querySelectorAll('.src-hi').forEach(function(x){x.classList.remove('src-hi')});
  if(!t) return;
  var root = t.closest('.ssd-tokens'); if(!root) return;
  var s = parseInt(t.getAttribute('data-src')), n = parseInt(t.getAttribute('data-srclen') || '1');
  for (var i = s; i < s + n; i++) {
    var el = root.querySelector('[data-pos="' + i + '"]'); if (el) el.classList.add('src-hi');
  }
});
// Verification lab: clicking a token picks its position (sets the position slider's number box).
document.addEventListener('click', function(e){
  var t = e.target.closest && e.target.closest('#vl-view .tok[data-pos]');
  if(!t) return;
  var box = document.querySelector('#vl-pos input[type=number]'); if(!box) return;
  box.value = t.getAttribute('data-pos');
  ['input', 'change'].forEach(function(k){ box.dispatchEvent(new Event(k, {bubbles: true})); });
  box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter', bubbles: true}));
  box.dispatchEvent(new Event('blur', {bubbles: true}));
});
