// The session report's script (eventstore/report.py inlines it; it loads nothing).
// It reads the JSON in #report-data and draws the page into <main id="app">. Data reaches
// the DOM only through textContent and setAttribute: never as markup.
(function () {
  'use strict';
  const t0 = performance.now();
  const D = JSON.parse(document.getElementById('report-data').textContent);
  const app = document.getElementById('app');
  const SVGNS = 'http://www.w3.org/2000/svg';
  const MSG_PAGE = 50, EV_PAGE = 100, FOLD_CHARS = 1200, FOLD_LINES = 20, FLIPS_LISTED = 500;

  // -- building DOM ----------------------------------------------------------------------
  function add(el, kids) {
    if (kids == null) return el;
    if (!Array.isArray(kids)) kids = [kids];
    for (const c of kids) {
      if (c == null || c === false) continue;
      el.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  function set(el, attrs) {
    for (const k in attrs) {
      const v = attrs[k];
      if (v == null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    return el;
  }
  const h = (tag, attrs, kids) => add(set(document.createElement(tag), attrs || {}), kids);
  const s = (tag, attrs, kids) => add(set(document.createElementNS(SVGNS, tag), attrs || {}), kids);

  const num = (n) => String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const when = (t) => (t ? t.replace('T', ' ') : '–');
  const plural = (n, one) => num(n) + ' ' + (n === 1 ? one : one + 's');
  const badge = (cls, text) => h('span', { class: 'badge b-' + cls }, text);
  function bytes(n) {
    const units = ['B', 'kB', 'MB', 'GB'];
    let i = 0;
    while (n >= 1000 && i < 3) { n /= 1000; i++; }
    return i ? n.toFixed(1) + ' ' + units[i] : n + ' B';
  }
  function section(id, title, kids) {
    return h('section', { id: id, 'aria-labelledby': id + '-h' },
      [h('h2', { id: id + '-h' }, title)].concat(kids));
  }
  function facts(rows) {
    const dl = h('dl', { class: 'facts' });
    for (const [k, v] of rows) if (v != null) add(dl, [h('dt', null, k), h('dd', null, v)]);
    return dl;
  }

  // -- overview ----------------------------------------------------------------------------
  function overview() {
    const m = D.manifest || {}, v = D.verify, z = D.sizes;
    const plan = (m.init_plan && m.init_plan.steps) || [];
    const manifest = [
      ['Objective', m.current_objective || '(no manifest)'],
      ['Branch', h('code', null, m.active_branch || '–')],
      ['Last known good commit', h('code', null, m.last_known_good_commit || '–')],
      ['Harness', m.harness_version ? m.harness_version + ' (schema ' + m.schema_version + ')' : null],
    ];
    for (const k of Object.keys(m.metadata || {})) manifest.push([k, m.metadata[k]]);
    if (plan.length) {
      manifest.push(['Init plan', h('ol', null, plan.map((st) => h('li', null, h('code', null,
        st.kind === 'command' ? [st.program].concat(st.args || []).join(' ')
          : st.shell + ': ' + st.script))))]);
    }
    const integrity = [
      ['Verify', [badge(v.ok ? 'ok' : 'bad', v.ok ? 'verified' : 'FAILED'), ' ',
        (v.errors ? plural(v.errors, 'error') : 'no errors') +
        (v.problems_total > v.errors ? ', ' + plural(v.problems_total - v.errors, 'warning')
          : '')]],
      ['Head', [h('code', { id: 'head-hash' }, v.head_hash || '–'), ' at seq ' + num(v.head_seq)]],
      ['Events', num(z.events) + ' (seq ' + num(z.first_seq) + '–' + num(z.last_seq) + ')'],
      ['Time', when(z.first_ts) + ' → ' + when(z.last_ts)],
      ['Log', bytes(z.log_bytes) + ', ' + plural(z.log_events, 'line')],
      ['Archive', z.archive_files
        ? bytes(z.archive_bytes) + ' in ' + plural(z.archive_files, 'file') : 'none'],
      ['Compaction', z.snapshots || z.compacted_without_archive
        ? plural(z.snapshots, 'snapshot') + (z.compacted_without_archive ? ', ' +
          num(z.compacted_without_archive) + ' events compacted without an archive' : '')
        : null],
      ['Transcript', plural(z.messages, 'message')],
      ['Features', num(z.features)],
    ];
    const kids = [D.unreadable ? h('p', { class: 'alert', id: 'unreadable' },
      'This session\'s log does not read, so only what verify found is shown: ' +
      D.unreadable) : null, h('div', { class: 'grid2' }, [
      h('div', { class: 'panel' }, [h('h3', null, 'Manifest'), facts(manifest)]),
      h('div', { class: 'panel' }, [h('h3', null, 'Integrity and size'), facts(integrity)]),
    ])];
    const problem = (p) => h('li', null, [
      badge(p.severity === 'error' ? 'bad' : 'none', p.severity), ' ', h('code', null, p.kind),
      ' seq ' + (p.seq == null ? '–' : p.seq) + ', byte ' + p.offset + ' of ' + p.file + ': ' +
      p.message]);
    // errors in sight; warnings (a torn tail, event types this reader does not know) folded
    const errors = v.problems.filter((p) => p.severity === 'error');
    const warnings = v.problems.filter((p) => p.severity !== 'error');
    const unlisted = v.problems_total > v.problems.length
      ? h('p', { class: 'muted' }, 'The first ' + v.problems.length + ' of ' +
        num(v.problems_total) + ' problems are listed (eventstore verify lists them all).')
      : null;
    if (errors.length) {
      kids.push(h('h3', null, 'Verify errors (' + num(v.errors) + ')'));
      kids.push(h('ul', { id: 'problems' }, errors.map(problem)));
    }
    if (warnings.length) {
      kids.push(h('details', null, [
        h('summary', null, 'Verify warnings (' + num(v.problems_total - v.errors) + ')'),
        h('ul', { id: 'warnings' }, warnings.map(problem))]));
    }
    kids.push(unlisted);
    return section('overview', 'Overview', kids);
  }

  // -- features passing over time ------------------------------------------------------------
  function ticks(lo, hi, n) {
    let step = Math.max(1, Math.pow(10, Math.floor(Math.log10((hi - lo) / n || 1))));
    while ((hi - lo) / step > n) step *= String(step)[0] === '2' ? 2.5 : 2;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) out.push(Math.round(v));
    return out;
  }

  function chartSvg() {
    const pts = D.chart, z = D.sizes, W = 860, H = 260, L = 44, R = 16, T = 14, B = 36;
    const x0 = pts.length ? Math.min(pts[0][0], z.first_seq || 1) : 1;
    const x1 = Math.max(z.last_seq, x0 + 1);
    const ymax = pts.reduce((m, p) => Math.max(m, p[3]), 1);
    const X = (q) => L + (q - x0) / (x1 - x0) * (W - L - R);
    const Y = (n) => T + (1 - n / ymax) * (H - T - B);
    const last = pts.length ? pts[pts.length - 1] : null;
    const svg = s('svg', { class: 'chart', id: 'chart', viewBox: '0 0 ' + W + ' ' + H,
      role: 'img', 'aria-labelledby': 'chart-t chart-d' });
    add(svg, [s('title', { id: 'chart-t' }, 'Features passing over time'),
      s('desc', { id: 'chart-d' }, last
        ? 'Step chart by sequence number: ' + last[2] + ' of ' + last[3] +
          ' features pass at seq ' + last[0] + '; ' + plural(D.flips.length, 'flip') + ' marked.'
        : 'No feature events.')]);
    for (const n of ticks(0, ymax, 5)) {
      add(svg, [s('line', { x1: L, x2: W - R, y1: Y(n), y2: Y(n), stroke: '#e3e5e8' }),
        s('text', { x: L - 6, y: Y(n) + 4, 'text-anchor': 'end' }, String(n))]);
    }
    for (const q of ticks(x0, x1, 8)) {
      add(svg, s('text', { x: X(q), y: H - B + 16, 'text-anchor': 'middle' }, num(q)));
    }
    const mid = (T + H - B) / 2;
    add(svg, [
      s('text', { x: (L + W - R) / 2, y: H - 4, 'text-anchor': 'middle' }, 'sequence number'),
      s('text', { x: 12, y: mid, 'text-anchor': 'middle', transform: 'rotate(-90 12 ' + mid + ')' },
        'features passing'),
      s('line', { x1: L, x2: W - R, y1: Y(0), y2: Y(0), stroke: '#767676' })]);
    if (!pts.length) return svg;
    // one path per series and one per marker kind: cheap at any number of points
    let pass = 'M' + X(pts[0][0]) + ' ' + Y(pts[0][2]);
    let total = 'M' + X(pts[0][0]) + ' ' + Y(pts[0][3]);
    for (const p of pts.slice(1)) {
      pass += 'H' + X(p[0]) + 'V' + Y(p[2]);
      total += 'H' + X(p[0]) + 'V' + Y(p[3]);
    }
    pass += 'H' + X(x1);
    total += 'H' + X(x1);
    const after = new Map(pts.map((p) => [p[0], p[2]]));
    let up = '', down = '';
    for (const f of D.flips) {
      if (!after.has(f[0])) continue;
      const px = X(f[0]), py = Y(after.get(f[0]));
      if (f[3]) up += 'M' + px + ' ' + (py - 9) + 'l5 8h-10z';
      else down += 'M' + px + ' ' + (py + 9) + 'l5 -8h-10z';
    }
    add(svg, [
      s('path', { d: total, fill: 'none', stroke: '#767676', 'stroke-dasharray': '5 4',
        class: 'total' }),
      s('path', { d: pass, fill: 'none', stroke: '#0b57d0', 'stroke-width': 2.5, class: 'passing' }),
      s('path', { d: up, fill: '#1a7f37', class: 'flip-up' }),
      s('path', { d: down, fill: '#b42318', class: 'flip-down' })]);
    return svg;
  }

  function features() {
    const pts = D.chart, last = pts.length ? pts[pts.length - 1] : null;
    const failing = D.features.filter((f) => !f.passes);
    const passing = D.features.filter((f) => f.passes);
    const item = (f) => h('li', { 'data-feature': f.id }, [h('code', null, f.id), ' ',
      f.description, h('span', { class: 'muted' }, ' (' + f.category +
        (f.flipped_at ? ', flipped at seq ' + num(f.flipped_at) : '') + ')')]);
    const legend = h('div', { class: 'legend' }, [
      h('span', { class: 'passing' }, '━ features passing'),
      h('span', { class: 'total' }, '┅ features in the list'),
      h('span', { class: 'up' }, '▲ flipped to pass'),
      h('span', { class: 'down' }, '▼ flipped to fail')]);
    const kids = [
      h('p', { id: 'features-summary' }, (last
        ? last[2] + ' of ' + last[3] + ' features pass' : 'No feature list yet') +
        (D.omitted.chart_points ? ' (the chart shows the last ' + num(pts.length) + ' changes)'
          : '')),
    ];
    if (pts.length) kids.push(h('figure', null, [chartSvg(), legend]));
    if (D.features.length) {
      kids.push(h('h3', { id: 'failing-h' }, 'Failing features (' + failing.length + ')'),
        failing.length
          ? h('ul', { class: 'features', id: 'failing', 'aria-labelledby': 'failing-h' },
            failing.map(item))
          : h('p', null, 'None: every feature passes.'),
        h('details', null, [h('summary', null, 'Passing features (' + passing.length + ')'),
          h('ul', { class: 'features', id: 'passing' }, passing.map(item))]));
    }
    if (D.flips.length) {
      const listed = D.flips.slice(-FLIPS_LISTED);
      kids.push(h('details', null, [
        h('summary', null, 'Flips (' + num(D.flips.length) + ')' +
          (listed.length < D.flips.length ? ', the last ' + FLIPS_LISTED : '')),
        h('table', { class: 'events', id: 'flips' }, [
          h('thead', null, h('tr', null, ['Seq', 'Time (UTC)', 'Feature', 'Now'].map(
            (c) => h('th', { scope: 'col' }, c)))),
          h('tbody', null, listed.map((f) => h('tr', null, [
            h('td', { class: 'num' }, num(f[0])), h('td', null, when(f[1])),
            h('td', null, h('code', null, f[2])),
            h('td', null, badge(f[3] ? 'passes' : 'fails', f[3] ? 'passes' : 'fails'))])))])]));
    }
    return section('features', 'Features passing over time', kids);
  }

  // -- runs ----------------------------------------------------------------------------------
  function runs() {
    const rs = D.runs;
    if (!rs.length) {
      return section('runs', 'Runs', [h('p', null, 'No run checkpoints or progress notes.')]);
    }
    const times = [];
    for (const r of rs) {
      for (const t of [r.started_at, r.completed_at, ...r.progress.map((p) => p[0])]) {
        if (t) times.push(Date.parse(t));
      }
    }
    const lo = times.length ? times.reduce((a, b) => Math.min(a, b)) : 0;
    const span = Math.max(1, times.reduce((a, b) => Math.max(a, b), lo) - lo);
    const pct = (t) => (Date.parse(t) - lo) / span * 100;
    return section('runs', 'Runs (' + rs.length + ')', [h('ol', { class: 'runs' }, rs.map((r) => {
      const st = r.status.replace(/ /g, '_'), a = r.started_at;
      const b = r.completed_at || (r.progress.length ? r.progress[r.progress.length - 1][0] : a);
      const bar = h('div', { class: 'bar' });
      if (a) {
        bar.style.left = pct(a) + '%';
        bar.style.width = Math.max(0.3, pct(b) - pct(a)) + '%';
      }
      const minutes = a && r.completed_at
        ? ' (' + Math.round((Date.parse(r.completed_at) - Date.parse(a)) / 60000) + ' min)' : '';
      return h('li', { class: 's-' + st, 'data-run': r.run_id }, [
        h('h3', null, [h('code', null, r.run_id), ' ', badge(st, r.status.replace(/_/g, ' '))]),
        h('div', { class: 'muted' }, 'started ' + when(a) +
          (r.completed_at ? ' · completed ' + when(r.completed_at) + minutes : '') +
          ' · ' + plural(r.checkpoints, 'checkpoint')),
        a ? h('div', { class: 'track', 'aria-hidden': 'true' }, bar) : null,
        r.note ? h('p', null, r.note) : null,
        r.progress.length ? h('ul', { class: 'notes', 'aria-label': 'progress notes of ' + r.run_id },
          r.progress.map((p) => h('li', null, [h('span', { class: 'muted' }, when(p[0]) + ' '),
            p[1]]))) : null]);
    }))]);
  }

  // -- paging and filtering (transcript, events) ------------------------------------------------
  function pager(state, total, size, redraw) {
    const pages = Math.max(1, Math.ceil(total / size));
    if (state.page >= pages) state.page = pages - 1;
    const go = (text, p, off) => h('button', { type: 'button', disabled: off,
      onclick: () => { state.page = p; redraw(); } }, text);
    const first = state.page === 0, last = state.page >= pages - 1;
    return h('nav', { class: 'pager', 'aria-label': state.label + ' pages' }, [
      go('« First', 0, first), go('‹ Previous', state.page - 1, first),
      h('span', null, 'page ' + num(state.page + 1) + ' of ' + num(pages)),
      go('Next ›', state.page + 1, last), go('Last »', pages - 1, last)]);
  }
  function filterBox(id, label, placeholder, state, redraw) {
    let timer = null;
    const input = h('input', { type: 'search', id: id, placeholder: placeholder,
      oninput: () => {
        clearTimeout(timer);
        timer = setTimeout(() => { state.text = input.value.toLowerCase(); state.page = 0; redraw(); },
          150);
      } });
    return [h('label', { for: id }, label + ' '), input];
  }
  function checkboxes(legend, counts, state, redraw) {
    const box = h('fieldset', null, h('legend', null, legend));
    for (const k of Object.keys(counts)) {
      state.shown[k] = true;
      add(box, h('label', null, [h('input', { type: 'checkbox', checked: true, 'data-key': k,
        onchange: (e) => { state.shown[k] = e.target.checked; state.page = 0; redraw(); } }),
      ' ' + k + ' (' + num(counts[k]) + ')']));
    }
    return box;
  }
  function range(state, size, shown, all, noun) {
    if (!shown) return 'No ' + noun + ' matches.';
    const from = state.page * size + 1, to = Math.min(shown, (state.page + 1) * size);
    return noun[0].toUpperCase() + noun.slice(1) + 's ' + num(from) + '–' + num(to) + ' of ' +
      num(shown) + (shown < all ? ' matching (' + num(all) + ' in all)' : '');
  }

  // -- transcript ------------------------------------------------------------------------------
  function folded(text, cls) {
    const lines = text.split('\n');
    if (text.length <= FOLD_CHARS && lines.length <= FOLD_LINES) return h('pre', { class: cls }, text);
    let short = lines.slice(0, FOLD_LINES).join('\n');
    if (short.length > FOLD_CHARS) short = short.slice(0, FOLD_CHARS);
    const more = 'Show all (' + num(text.length) + ' characters)';
    const pre = h('pre', { class: cls }, short + ' …');
    let open = false;
    const btn = h('button', { type: 'button', 'aria-expanded': 'false', onclick: () => {
      open = !open;
      pre.textContent = open ? text : short + ' …';
      btn.textContent = open ? 'Show less' : more;
      btn.setAttribute('aria-expanded', String(open));
    } }, more);
    return h('div', { class: 'folded' }, [pre, btn]);
  }
  function message(m) {
    const body = folded(m.content, 'content');
    const kids = [h('div', { class: 'mhead' }, [h('strong', null, '#' + num(m.index)),
      badge(m.role, m.role),
      m.seq != null ? h('span', { class: 'muted' }, 'seq ' + num(m.seq)) : null,
      m.ts ? h('span', { class: 'muted' }, when(m.ts)) : null])];
    // tool results are long and rarely read: folded away, one click to open
    kids.push(m.role === 'tool' ? h('details', { class: 'tool' }, [
      h('summary', null, 'tool result (' + num(m.content.length) + ' characters)'), body]) : body);
    if (m.length != null) {
      kids.push(h('p', { class: 'muted' }, 'Cut to ' + num(m.content.length) + ' of ' +
        num(m.length) + ' characters to keep this page small (eventstore transcript --full' +
        ' shows it all).'));
    }
    // other fields (tool calls, tool results, a name, metadata...): closed until opened
    for (const [label, text] of m.extras || []) {
      kids.push(h('details', { class: 'extra', 'data-field': label }, [
        h('summary', null, label.replace(/_/g, ' ')), folded(text, 'extra')]));
    }
    return h('li', { class: 'r-' + m.role }, kids);
  }
  function transcript() {
    const ms = D.messages, counts = Object.create(null);
    const state = { page: 0, label: 'transcript', text: '', shown: Object.create(null) };
    for (const m of ms) counts[m.role] = (counts[m.role] || 0) + 1;
    let lower = null; // the searchable text, built on the first search
    const haystack = (i) => {
      if (!lower) {
        lower = ms.map((m) => (m.content + '\n' + (m.extras || []).map((x) => x[1]).join('\n'))
          .toLowerCase());
      }
      return lower[i];
    };
    const count = h('p', { id: 'msg-count', 'aria-live': 'polite' });
    const top = h('div'), bottom = h('div');
    const list = h('ol', { class: 'messages', id: 'messages' });
    function draw() {
      const hits = [];
      ms.forEach((m, i) => {
        if (state.shown[m.role] && (!state.text || haystack(i).includes(state.text))) hits.push(m);
      });
      top.replaceChildren(pager(state, hits.length, MSG_PAGE, draw));
      bottom.replaceChildren(pager(state, hits.length, MSG_PAGE, draw));
      count.textContent = range(state, MSG_PAGE, hits.length, ms.length, 'message');
      list.replaceChildren(...hits.slice(state.page * MSG_PAGE, (state.page + 1) * MSG_PAGE)
        .map(message));
    }
    const controls = h('div', { class: 'controls' }, [checkboxes('Roles', counts, state, draw),
      ...filterBox('msg-filter', 'Filter messages', 'text in a message', state, draw)]);
    draw();
    return section('transcript', 'Transcript (' + plural(D.sizes.messages, 'message') + ')', [
      D.omitted.messages ? h('p', { class: 'muted' }, 'The first ' + num(D.omitted.messages) +
        ' messages are left out of this page (eventstore transcript shows them).') : null,
      controls, count, top, list, bottom]);
  }

  // -- events ----------------------------------------------------------------------------------
  function events() {
    const evs = D.events, state = { page: 0, label: 'event log', text: '', shown: Object.create(null) };
    const count = h('p', { id: 'ev-count', 'aria-live': 'polite' }), top = h('div');
    const body = h('tbody');
    function draw() {
      const hits = evs.filter((e) => state.shown[e[2]] &&
        (!state.text || e[3].toLowerCase().includes(state.text)));
      top.replaceChildren(pager(state, hits.length, EV_PAGE, draw));
      count.textContent = range(state, EV_PAGE, hits.length, evs.length, 'event');
      body.replaceChildren(...hits.slice(state.page * EV_PAGE, (state.page + 1) * EV_PAGE)
        .map((e) => h('tr', { 'data-seq': e[0] }, [h('td', { class: 'num' }, num(e[0])),
          h('td', null, when(e[1])), h('td', null, h('code', null, e[2])),
          h('td', { class: 'summary' }, e[3])])));
    }
    const controls = h('div', { class: 'controls' }, [
      checkboxes('Event types', D.event_types, state, draw),
      ...filterBox('ev-filter', 'Filter events', 'text in a summary', state, draw)]);
    draw();
    return section('events', 'Event log (' + plural(D.sizes.events, 'event') + ')', [
      D.omitted.events ? h('p', { class: 'muted' }, 'The first ' + num(D.omitted.events) +
        ' events are left out of this page (eventstore log shows them).') : null,
      controls, count, top,
      h('table', { class: 'events', id: 'event-table' }, [
        h('caption', { class: 'muted' }, 'Events in sequence order'),
        h('thead', null, h('tr', null, ['Seq', 'Time (UTC)', 'Type', 'Summary'].map(
          (c) => h('th', { scope: 'col' }, c)))),
        body])]);
  }

  document.getElementById('generated').textContent =
    'Generated ' + when(D.generated_at) + ' by ' + D.generator;
  add(app, [overview(), features(), runs(), transcript(), events()]);
  document.body.setAttribute('data-render-ms', String(Math.round(performance.now() - t0)));
  document.body.setAttribute('data-rendered', 'ok');
})();
