-- Argo CD health of a module-manager Manifest (modulemanager.io/Manifest), read from the
-- conditions the operator writes by the Kubernetes conventions (kstatus, fluxcd/pkg):
--   Ready=True                                   -> Healthy
--   Stalled=True (permanent error, readiness
--     deadline passed, an object failed)         -> Degraded
--   Reconciling=True, reason ProgressingWithRetry
--     (a failed pass that is retried)            -> Degraded (as Argo CD shows a retried
--                                                   Flux HelmRelease), the error as message
--   Reconciling=True (rolling out, a hook runs)  -> Progressing
--   spec.suspend                                 -> Suspended
--   being deleted, no status yet, or a status of
--     an older generation                        -> Progressing
--   anything else (a refused prune)              -> Degraded
-- The message is the Ready condition's message (the operator keeps a long one's beginning and
-- end). Tested against the statuses the pipeline writes: src/reconcile/argocd_health.rs.
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function says(c)
  if c == nil then
    return ""
  end
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return c.reason or ""
end

local ready = condition("Ready")

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Pending deletion"
  if ready ~= nil and (ready.reason == "Deleting" or ready.reason == "DependentsExist" or ready.reason == "DeletionRateLimited") then
    hs.message = "Pending deletion: " .. says(ready)
  end
  return hs
end

if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = "Manifest is suspended"
  return hs
end

if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile"
  return hs
end

local generation = obj.metadata and obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for generation " .. generation .. " to be reconciled"
  return hs
end

local stalled = condition("Stalled")
local reconciling = condition("Reconciling")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = says(stalled)
elseif ready.status == "True" then
  hs.status = "Healthy"
  hs.message = says(ready)
elseif reconciling ~= nil and reconciling.status == "True" then
  if reconciling.reason == "ProgressingWithRetry" then
    hs.status = "Degraded"
    hs.message = "Retrying: " .. says(ready)
  else
    hs.status = "Progressing"
    hs.message = says(ready)
  end
else
  hs.status = "Degraded"
  hs.message = says(ready)
end
return hs
