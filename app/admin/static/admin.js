// keyseed admin dashboard: small enhancements only; every page works without script.
"use strict";

// Forms that change something irreversible ask first (data-confirm="question").
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (!(form instanceof HTMLFormElement)) return;
  const question = form.dataset.confirm;
  if (question && !window.confirm(question)) event.preventDefault();
});

// The audit filters apply as soon as a list choice changes.
document.addEventListener("change", (event) => {
  const field = event.target;
  if (field instanceof HTMLSelectElement && field.form && field.form.matches("form.filters")) {
    field.form.requestSubmit();
  }
});
