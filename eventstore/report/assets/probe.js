// The report's error probe (runs before the page's script): any error, rejected promise,
// console.error or blocked load is written into #js-errors, where a person and the
// browser tests see it.
(function () {
  'use strict';
  const box = document.getElementById('js-errors');
  function note(text) { box.hidden = false; box.textContent += text + '\n'; }
  window.addEventListener('error',
    (e) => note('error: ' + e.message + ' (' + e.lineno + ':' + e.colno + ')'));
  window.addEventListener('unhandledrejection', (e) => note('unhandled rejection: ' + e.reason));
  document.addEventListener('securitypolicyviolation',
    (e) => note('blocked by the page policy: ' + e.violatedDirective + ' ' + e.blockedURI));
  const original = console.error;
  console.error = function (...args) {
    note('console.error: ' + args.join(' '));
    original.apply(console, args);
  };
})();
