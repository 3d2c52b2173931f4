-- name: register_watermark
INSERT INTO {watermarks} (name, position, updated_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING

-- name: advance_watermark
INSERT INTO {watermarks} AS w (name, position, updated_at) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET position = greatest(w.position, EXCLUDED.position), updated_at = EXCLUDED.updated_at
RETURNING position

-- name: drop_watermark
DELETE FROM {watermarks} WHERE name = $1

-- name: list_watermarks
SELECT name, position, updated_at FROM {watermarks} ORDER BY name

-- The position of watermark $1, locked (FOR SHARE) until the transaction ends: its owner cannot advance past a
-- message staged in that transaction (Outbox.WatermarkTx).
-- name: watermark_for_share
SELECT position FROM {watermarks} WHERE name = $1 FOR SHARE
