"""Django's PostgreSQL backend, with spare connections (gpucloud.lib.db): settings.DATABASES
names it as ENGINE for PostgreSQL."""
