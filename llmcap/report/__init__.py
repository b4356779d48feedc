"""Human-readable reports (Markdown; HTML later) rendered from stage outputs."""
