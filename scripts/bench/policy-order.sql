-- The order cancel.sql takes the policies in (scripts/bench, after each
-- reset): shuffled, as cmd/loadtest shuffles them. In id order consecutive
-- cancellations share a page of policies, so after a checkpoint the floor
-- dirtied ~70 times fewer pages than the app and wrote almost no full-page
-- images (0.04 per cancellation against the app's 1.3: 21 KB of WAL per
-- cancellation against 40 KB).
SELECT setseed(0.5);
DROP TABLE IF EXISTS pgbench_policy_order;
CREATE TABLE pgbench_policy_order AS
SELECT row_number() OVER (ORDER BY random()) AS n, id, user_id
  FROM policies
 WHERE status = 'ACTIVE';
CREATE UNIQUE INDEX ON pgbench_policy_order (n);
