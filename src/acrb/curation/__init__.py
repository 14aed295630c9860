"""The FairFace curation tool: store, study import, finalize, and its web pages."""
