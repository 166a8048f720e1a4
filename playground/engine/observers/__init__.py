"""The decode loop's observers, one module each (the interface and the registry: ``playground.engine.observe``);
every module here registers its factory when imported, and the registry imports them all on first use."""
