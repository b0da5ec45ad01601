"""The operators' fleet page: a staff-only page in the admin's look at /admin/fleet/.

`selectors` reads (a few aggregate queries, whatever the fleet's size; one pure helper
turns allocation intervals into a ratio over time); `views` only renders them.
"""
