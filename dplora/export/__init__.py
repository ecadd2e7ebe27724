"""Exports of a release for serving (``dplora export``): a merged model or the adapter folder, with a signed
manifest chaining every output file to the release record (post-processing: no privacy budget)."""
