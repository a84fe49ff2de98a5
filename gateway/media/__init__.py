"""Media: the files that come with messages (issue 19), from the platform to the model.

What each module owns (API in each module's docstring):

* ``store``: the content-addressed blob store (``BlobStore.put(data, mime) -> BlobRef``,
  ``get(ref) -> bytes``, ``path(ref)``, ``delete``), on files or in the database.
* ``extract``: a document's text for the model (``extract(data, name=, mime=, max_tokens=) ->
  Extracted``): text, Markdown, CSV, JSON, code, HTML, PDF, DOCX, XLSX; pure, never raises.
* ``transcribe``: speech to text through ``POST /v1/audio/transcriptions`` (``Transcriber``).
* the types live in ``gateway.core.types`` (adapters need them): ``Attachment`` (what a platform
  announced: kind, MIME type, size, file name, platform reference), ``BlobRef`` and ``MediaRef``
  (what the transcript keeps: sha256, kind, mime type, size, name; never the bytes).

Rule: the transcript refers to blobs, it never holds bytes, so loading a session reads no blob;
a turn reads only the blobs of the images it sends.
"""
