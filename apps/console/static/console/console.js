// The console's only script, a file so the Content-Security-Policy can forbid every inline one
// (docs/decisions/0092). A form with data-confirm asks before it is sent. ("Back" links are real
// links to the page they name, so they work without it: docs/decisions/0103.)
"use strict";
document.addEventListener("submit", (event) => {
  const question = event.target.dataset.confirm;
  if (question !== undefined && !window.confirm(question)) {
    event.preventDefault();
  }
});
