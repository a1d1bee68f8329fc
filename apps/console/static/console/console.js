// The console's only script, a file so the Content-Security-Policy can forbid every inline one
// (docs/decisions/0092). A form with data-confirm asks before it is sent; data-back goes back.
"use strict";
document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question !== undefined && !window.confirm(question)) {
    event.preventDefault();
  }
});
document.addEventListener("click", (event) => {
  if (event.target.closest("[data-back]")) {
    event.preventDefault();
    window.history.back();
  }
});
