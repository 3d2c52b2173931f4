-- Crypto-shredding (package shred): the keys that encrypt personal data, per subject and key version, and the
-- record of what was done to them. Forgetting a subject deletes its key rows, so what they encrypted can never be
-- read again; the subject row and the audit rows stay (they hold the subject's ID, never personal data). Owned by
-- package shred.
CREATE TABLE shred_subjects (
    subject         text        PRIMARY KEY,
    -- The version new writes use; 0 until the first key is made. It only grows: a key made after the subject
    -- was forgotten, or by a rotation, takes the next version, so a forgotten version is never made again.
    current_version integer     NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- When the subject was last forgotten (NULL: never, or a key was made again since).
    forgotten_at    timestamptz
);

CREATE TABLE shred_keys (
    subject    text        NOT NULL REFERENCES shred_subjects (subject),
    version    integer     NOT NULL CHECK (version > 0),
    -- AES-256 key material (32 bytes).
    material   bytea       NOT NULL CHECK (length(material) = 32),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subject, version)
);

-- Every rotation and every forget: who, why, which versions.
CREATE TABLE shred_audit (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    action   text        NOT NULL CHECK (action IN ('forget', 'rotate')),
    subject  text        NOT NULL,
    -- forget: the versions whose material was deleted; rotate: the new version.
    versions integer[]   NOT NULL,
    actor    text        NOT NULL DEFAULT '',
    reason   text        NOT NULL DEFAULT ''
);

CREATE INDEX shred_audit_subject_idx ON shred_audit (subject, id);
