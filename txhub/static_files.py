"""Static files (the admin's, the console's, the Swagger UI's) served by WhiteNoise, with its table
of files built once per process (docs/decisions/0060)."""

from typing import Any

from django.conf import settings
from whitenoise.middleware import WhiteNoiseMiddleware

# Finder URL -> WhiteNoise's StaticFile, per configuration.
_FROM_FINDERS: dict[tuple[Any, ...], dict[str, Any]] = {}


class StaticFilesMiddleware(WhiteNoiseMiddleware):  # type: ignore[misc]
    """WhiteNoise's middleware. Without autorefresh the apps' static files cannot change while
    the process runs, so the table of them (each file found, stat-ed, its headers and compressed
    variants prepared) is built by the first instance and reused by every later one: a Django
    handler that loads its middleware again (each test client does) does not walk every app's
    static directory again."""

    def add_files_from_finders(self) -> None:
        key = (
            self.static_prefix,
            tuple(settings.STATICFILES_FINDERS),
            tuple(map(str, settings.STATICFILES_DIRS)),
            tuple(settings.INSTALLED_APPS),
        )
        found = _FROM_FINDERS.get(key)
        if found is None:
            before = dict(self.files)
            super().add_files_from_finders()
            found = {url: file for url, file in self.files.items() if url not in before}
            _FROM_FINDERS[key] = found
        for url, static_file in found.items():
            self.files.setdefault(url, static_file)
